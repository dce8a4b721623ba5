"""Make the verl 0.9.1 `trainer.rollout_data_dir` fixture with verl's own writing code.

verl's trainer cannot run here (no GPU; RayPPOTrainer needs ray, vLLM/SGLang and GPUs), so this
script takes the real code out of the verl wheel and feeds it a batch built the way the trainer
builds one:

  * From verl-0.9.1-py3-none-any.whl (source text, by AST, not re-typed) it takes the
    RayPPOTrainer methods `_log_rollout_data`, `_dump_generations`, `_write_generations`
    (a staticmethod), `_init_dump_executor` and `_shutdown_dump_executor` from
    verl/trainer/ppo/ray_trainer.py, and verl/utils/reward_score/math_dapo.py whole
    (`compute_score` returns {"score", "acc", "pred"}, the reward_extra_info that verl's
    NaiveRewardManager passes on for a dict result).
  * The only stand-ins are `marked_timer` (a timer context) and a minimal DataProto
    (`.batch` tensors, `.non_tensor_batch` numpy arrays, iteration over rows), which is all
    `_log_rollout_data` touches.
  * The batch: 2 prompts per step, rollout.n=4 samples each (rows of a group are adjacent, as
    after `batch.repeat(interleave=True)`; with balance_batch and dp>1 a real run permutes them).
    Prompts are DAPO-style math questions (every second one asks to copy an 'Answer: N' line, so
    some rows are correct) rendered with SmolLM2's chat template
    (add_generation_prompt=True; the template adds SmolLM's default system message) and
    left-padded with the pad token, as verl's dataset does; responses are sampled from
    SmolLM2-135M-Instruct (max 32 new tokens = response_length, so some are cut), then
    <|im_end|> and right padding. token_level_scores puts the math_dapo score on the last
    response token; reward_extra_infos_dict holds score/acc/pred as numpy arrays, as the reward
    loop leaves them in non_tensor_batch; non_tensor_batch also carries `request_id` (uuid hex),
    which `_log_rollout_data` adds to the dump when present.
  * Steps 1..6 are written to OUT_DIR/{step}.jsonl by verl's `_write_generations`.

How to run (any venv with torch, transformers and numpy; we used /work/venv-trl from
make_trl_fixture.py: torch 2.13.0+cpu, transformers 5.24.0, numpy from that venv):
    pip download verl==0.9.1 --no-deps -d /work/verl-wheel
    /work/venv-trl/bin/python tests/data/make_verl_fixture.py \
        /work/verl-wheel/verl-0.9.1-py3-none-any.whl tests/data/verl-0.9.1/rollout_data \
        [--model /root/.cache/rlgen/models/smollm2-135m-instruct-v1]
"""

import argparse
import ast
import contextlib
import hashlib
import json
import os
import sys
import textwrap
import time
import uuid
import zipfile
from pathlib import Path

import numpy as np
import torch

DEFAULT_MODEL = "/root/.cache/rlgen/models/smollm2-135m-instruct-v1"
VERL_VERSION = "0.9.1"
STEPS = 6
N = 4  # actor_rollout_ref.rollout.n
PROMPTS_PER_STEP = 2
RESPONSE_LENGTH = 32  # data.max_response_length
PROMPT_LENGTH = 128  # data.max_prompt_length (left padding up to this)
METHODS = ["_log_rollout_data", "_dump_generations", "_write_generations", "_init_dump_executor",
           "_shutdown_dump_executor"]

# DAPO-style prompt (the math_dapo reward looks for a final "Answer:" line)
DAPO = ("Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{q}\n\n"
        "Remember to put your answer on its own line after \"Answer:\".")
COPY = "Write exactly this line and nothing else: Answer: {a}"
QUESTIONS = [  # per step: one real question, one the model can copy (so some rows score 1.0)
    ("What is 7 + 5?", "12"), (COPY.format(a=27), "27"), ("What is 15 - 8?", "7"),
    (COPY.format(a=42), "42"), ("What is 100 / 4?", "25"), (COPY.format(a=32), "32"),
    ("What is 81 / 9?", "9"), (COPY.format(a=42), "42"), ("What is 11 * 11?", "121"),
    (COPY.format(a=33), "33"), ("What is 3 * 3 * 3?", "27"), (COPY.format(a=8), "8"),
]


def verl_source(wheel):
    with zipfile.ZipFile(wheel) as z:
        trainer = z.read("verl/trainer/ppo/ray_trainer.py").decode()
        math_dapo = z.read("verl/utils/reward_score/math_dapo.py").decode()
        meta = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        version = next(line.split(":", 1)[1].strip() for line in z.read(meta[0]).decode().splitlines()
                       if line.startswith("Version:"))
    if version != VERL_VERSION:
        sys.exit(f"wheel is verl {version}, wanted {VERL_VERSION}")
    tree = ast.parse(trainer)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RayPPOTrainer")
    found = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in METHODS}
    missing = set(METHODS) - set(found)
    if missing:
        sys.exit(f"not in RayPPOTrainer of the wheel: {missing}")
    decorators = {name: [ast.unparse(d) for d in node.decorator_list] for name, node in found.items()}
    # get_source_segment gives the text from `def` on (decorators not included)
    sources = {name: textwrap.dedent(ast.get_source_segment(trainer, node)) for name, node in found.items()}
    return version, sources, decorators, math_dapo


def build_trainer_stub(sources, decorators, tokenizer):
    from concurrent.futures import ThreadPoolExecutor

    @contextlib.contextmanager
    def marked_timer(name, timing_raw, color=None):  # stand-in for verl.utils.profiler.marked_timer
        start = time.time()
        yield
        timing_raw[name] = time.time() - start

    namespace = {"os": os, "json": json, "ThreadPoolExecutor": ThreadPoolExecutor, "marked_timer": marked_timer,
                 "DataProto": object}
    methods = {}
    for name, src in sources.items():
        exec(compile(src, f"<verl {VERL_VERSION} ray_trainer.py RayPPOTrainer.{name}>", "exec"), namespace)
        fn = namespace[name]
        methods[name] = staticmethod(fn) if "staticmethod" in decorators[name] else fn
    stub = type("RayPPOTrainerParts", (), methods)()
    stub.tokenizer = tokenizer
    stub.global_steps = 0
    stub._init_dump_executor()
    return stub


class Row:
    def __init__(self, non_tensor):
        self.non_tensor_batch = non_tensor


class MiniDataProto:
    """What _log_rollout_data reads of verl.protocol.DataProto: .batch, .non_tensor_batch, iteration."""

    def __init__(self, batch, non_tensor_batch):
        self.batch, self.non_tensor_batch = batch, non_tensor_batch

    def __len__(self):
        return next(iter(self.batch.values())).shape[0]

    def __iter__(self):
        for i in range(len(self)):
            yield Row({k: v[i] for k, v in self.non_tensor_batch.items()})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel")
    parser.add_argument("out_dir")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()

    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    version, sources, decorators, math_dapo_src = verl_source(args.wheel)
    math_dapo = {"__name__": "verl_math_dapo"}
    exec(compile(math_dapo_src, f"<verl {VERL_VERSION} verl/utils/reward_score/math_dapo.py>", "exec"), math_dapo)
    wheel_sha = hashlib.sha256(Path(args.wheel).read_bytes()).hexdigest()
    print(json.dumps({"verl": version, "wheel_sha256": wheel_sha, "torch": torch.__version__,
                      "transformers": transformers.__version__, "numpy": np.__version__}), flush=True)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    pad = tokenizer.pad_token_id
    eos = tokenizer.eos_token_id
    trainer = build_trainer_stub(sources, decorators, tokenizer)
    os.makedirs(args.out_dir, exist_ok=True)
    rng = np.random.default_rng(args.seed)

    for step in range(1, STEPS + 1):
        trainer.global_steps = step
        picked = [QUESTIONS[(step - 1) * PROMPTS_PER_STEP + j] for j in range(PROMPTS_PER_STEP)]
        prompt_rows, response_rows, lengths, gts, uids = [], [], [], [], []
        for q, answer in picked:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": DAPO.format(q=q)}],
                                                add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
            ids = list(ids)
            x = torch.tensor([ids] * N)
            with torch.no_grad():
                out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=1.0,
                                     max_new_tokens=RESPONSE_LENGTH, pad_token_id=pad, eos_token_id=eos)
            uid = str(uuid.UUID(bytes=rng.bytes(16), version=4))
            for r in out[:, len(ids):].tolist():
                if eos in r:
                    r = r[: r.index(eos) + 1]  # vLLM/SGLang stop at eos; it is kept in the response ids
                prompt_rows.append([pad] * (PROMPT_LENGTH - len(ids)) + ids)  # left padding
                response_rows.append(r + [pad] * (RESPONSE_LENGTH - len(r)))  # right padding
                lengths.append(len(r))
                gts.append(answer)
                uids.append(uid)
        responses = torch.tensor(response_rows)
        # reward: math_dapo on the decoded valid response, as NaiveRewardManager does
        infos = []
        for r, n_valid, gt in zip(response_rows, lengths, gts):
            text = tokenizer.decode(r[:n_valid], skip_special_tokens=True)
            infos.append(math_dapo["compute_score"](text, gt))
        token_level_scores = torch.zeros(len(response_rows), RESPONSE_LENGTH)
        for i, (n_valid, info) in enumerate(zip(lengths, infos)):
            token_level_scores[i, n_valid - 1] = info["score"]
        reward_extra_infos_dict = {k: np.array([info[k] for info in infos]) for k in infos[0]}
        batch = MiniDataProto(
            batch={"prompts": torch.tensor(prompt_rows), "responses": responses,
                   "token_level_scores": token_level_scores},
            non_tensor_batch={
                "data_source": np.array(["math_dapo"] * len(gts), dtype=object),
                "reward_model": np.array([{"style": "rule", "ground_truth": gt} for gt in gts], dtype=object),
                "uid": np.array(uids, dtype=object),
                "request_id": np.array([uuid.UUID(bytes=rng.bytes(16), version=4).hex for _ in gts], dtype=object),
                **reward_extra_infos_dict,
            },
        )
        timing_raw = {}
        trainer._log_rollout_data(batch, reward_extra_infos_dict, timing_raw, args.out_dir)
        cut = sum(1 for r in response_rows if eos not in r)
        print(f"step {step}: {len(gts)} rows, {cut} cut at {RESPONSE_LENGTH} tokens, timing {timing_raw}", flush=True)
    trainer._shutdown_dump_executor()


if __name__ == "__main__":
    main()
