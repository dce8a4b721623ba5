"""Make the TRL GRPO completion-log fixture with TRL's own code (a real GRPOTrainer run on CPU).

Pins (checked at start; the script stops if they differ):
    trl==1.16.0  torch==2.13.0 (CPU wheel)  transformers==5.24.0  accelerate==1.16.0
    datasets==5.2.0  pandas==3.1.1  pyarrow==26.0.1  (Python 3.11)

How to run (in a venv of its own, not rlgen's dev venv):
    python3 -m venv /work/venv-trl
    /work/venv-trl/bin/pip install torch==2.13.0 trl==1.16.0 transformers==5.24.0 \
        accelerate==1.16.0 datasets==5.2.0 pandas==3.1.1 pyarrow==26.0.1
    /work/venv-trl/bin/python tests/data/make_trl_fixture.py OUTPUT_DIR [--max-steps 25] \
        [--model /root/.cache/rlgen/models/smollm2-135m-instruct-v1]
    cp -r OUTPUT_DIR/completions tests/data/trl-1.16.0-grpo/completions

Variants (each README under tests/data/trl-1.16.0-grpo-*/ gives its exact command):
    --rows repeated         a dataset of one question twice (REPEATED_ROWS): with 8 rows per step
                            and num_generations=4, every step's batch holds it in two GRPO groups
    --logging-steps N       GRPOConfig.logging_steps (default: GRPOConfig's, 10)
    --num-iterations N      GRPOConfig.num_iterations (default 1): N > 1 reuses a generation batch
                            for N steps, so TRL logs the same rows under N steps
    --save-args             after training, trainer.save_model(OUTPUT_DIR/saved), which writes the
                            run's GRPOConfig as training_args.bin (the weights beside it are not
                            fixture material: copy training_args.bin only)

What it does: GRPOTrainer(log_completions=True) on CPU, model SmolLM2-135M-Instruct (local checkpoint,
no hub access), 8 conversational prompts with an `answer` column (6 without a system message, so the
chat template adds SmolLM's default one; 2 with a system message in the dataset), two reward
functions (`correct`, `brief`; `brief` logs two extra columns through TRL's `log_extra`),
num_generations=4, max_completion_length=24 (about half the completions are cut),
logging_steps=10 (TRL's GRPOConfig default), per_device_train_batch_size=8 (2 prompts x 4),
float32 weights, no gradient checkpointing, 1 torch thread (fast enough on a 2-core CPU).

TRL writes OUTPUT_DIR/completions/completions_{global_step:05d}.parquet from GRPOTrainer.log().
The script only watches: it wraps pandas.DataFrame.to_parquet to append one line per call
(path, rows, columns, time) to OUTPUT_DIR/parquet_writes.jsonl, then calls the original, so the
files themselves are written by TRL's code unchanged. That line log is how we see a file written twice.
"""

import argparse
import json
import os
import sys
import time

PINS = {
    "trl": "1.16.0",
    "torch": "2.13.0",
    "transformers": "5.24.0",
    "accelerate": "1.16.0",
    "datasets": "5.2.0",
    "pandas": "3.1.1",
    "pyarrow": "26.0.1",
}
DEFAULT_MODEL = "/root/.cache/rlgen/models/smollm2-135m-instruct-v1"

ROWS = [
    # (system message or None, question, answer)
    (None, "What is 7 + 5? Answer with the number only.", "12"),
    (None, "What is 9 * 3? Answer with the number only.", "27"),
    (None, "What is the capital of France? Answer in one word.", "Paris"),
    (None, "What is 15 - 8? Answer with the number only.", "7"),
    (None, "Which planet is known as the Red Planet? Answer in one word.", "Mars"),
    (None, "What is 6 * 7? Answer with the number only.", "42"),
    ("You are a calculator. Reply with a number only.", "What is 100 / 4?", "25"),
    ("You are a quiz player. Reply with one word.", "What color is the sky on a clear day?", "blue"),
]

# A dataset that holds one question twice (datasets hold duplicates; TRL samples with replacement
# across epochs): every step's batch of two prompts holds it in two GRPO groups.
REPEATED_ROWS = [
    (None, "What is 7 + 5? Answer with the number only.", "12"),
    (None, "What is 7 + 5? Answer with the number only.", "12"),
]


def check_versions():
    import importlib.metadata as md

    found = {name: md.version(name) for name in PINS}
    print("versions:", json.dumps(found), "python", sys.version.split()[0], flush=True)
    bad = {n: (v, PINS[n]) for n, v in found.items() if v.split("+")[0] != PINS[n]}
    if bad:
        sys.exit(f"version pins not met (found, wanted): {bad}")
    return found


def spy_on_to_parquet(log_path):
    import pandas as pd

    original = pd.DataFrame.to_parquet

    def to_parquet(self, path, *args, **kwargs):
        with open(log_path, "a") as f:
            f.write(json.dumps({"path": os.path.basename(str(path)), "rows": len(self),
                                "columns": list(map(str, self.columns)), "time": time.time()}) + "\n")
        return original(self, path, *args, **kwargs)

    pd.DataFrame.to_parquet = to_parquet


def correct(prompts, completions, answer, **kwargs):
    """1.0 when the expected answer appears in the completion's text (case-insensitive)."""
    return [1.0 if a.lower() in c[0]["content"].lower() else 0.0 for c, a in zip(completions, answer)]


def brief(prompts, completions, completion_ids, log_extra, **kwargs):
    """Shorter is better: 1 - tokens / 24. Logs the token count and the token ids via TRL's log_extra."""
    log_extra("completion_tokens", [len(ids) for ids in completion_ids])
    log_extra("completion_ids", [list(map(int, ids)) for ids in completion_ids])
    return [1.0 - len(ids) / 24.0 for ids in completion_ids]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir")
    parser.add_argument("--max-steps", type=int, default=25)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--rows", choices=("default", "repeated"), default="default",
                        help="the dataset: ROWS, or REPEATED_ROWS (one question twice)")
    parser.add_argument("--logging-steps", type=int, default=None, help="GRPOConfig.logging_steps (default: its own, 10)")
    parser.add_argument("--num-iterations", type=int, default=1, help="GRPOConfig.num_iterations (default 1)")
    parser.add_argument("--save-args", action="store_true",
                        help="trainer.save_model(OUTPUT_DIR/saved) after training (writes training_args.bin)")
    args = parser.parse_args()

    versions = check_versions()
    os.makedirs(args.output_dir, exist_ok=True)
    writes = os.path.join(args.output_dir, "parquet_writes.jsonl")
    if os.path.exists(writes):
        os.remove(writes)
    spy_on_to_parquet(writes)

    import torch

    # On a small shared CPU box one thread is several times faster than two fighting for the cores.
    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    data = []
    for system, question, answer in (REPEATED_ROWS if args.rows == "repeated" else ROWS):
        prompt = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
        data.append({"prompt": prompt, "answer": answer})
    dataset = Dataset.from_list(data)

    config = GRPOConfig(
        output_dir=args.output_dir,
        log_completions=True,
        num_generations=4,
        max_completion_length=24,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        max_steps=args.max_steps,
        # logging_steps left at GRPOConfig's default (10) unless --logging-steps
        **({"logging_steps": args.logging_steps} if args.logging_steps is not None else {}),
        num_iterations=args.num_iterations,
        learning_rate=1e-6,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        seed=1234,
        dataloader_num_workers=0,
        # SmolLM2's config says bfloat16; bf16 matmuls on this CPU are ~10x slower than float32
        model_init_kwargs={"dtype": "float32"},
        gradient_checkpointing=False,
    )
    print("logging_steps:", config.logging_steps, "generation_batch_size:", config.generation_batch_size, flush=True)
    trainer = GRPOTrainer(model=args.model, reward_funcs=[correct, brief], args=config, train_dataset=dataset)
    start = time.time()
    trainer.train()
    elapsed = time.time() - start
    if args.save_args:
        trainer.save_model(os.path.join(args.output_dir, "saved"))
    with open(os.path.join(args.output_dir, "run_info.json"), "w") as f:
        json.dump({"versions": versions, "max_steps": args.max_steps, "logging_steps": config.logging_steps,
                   "rows": args.rows, "num_iterations": args.num_iterations, "train_seconds": round(elapsed, 1), "model": args.model}, f, indent=1)
    print(f"train took {elapsed:.1f}s; files:", sorted(os.listdir(os.path.join(args.output_dir, "completions"))))


if __name__ == "__main__":
    main()
