"""One row of the size table (docs/archive/benchmarks-rounds-2026-12.md, "Model sizes"): what an RL
iteration's server-side steps cost at one model size, on one Engine started with rlgen's defaults beside a trainer
holding the same model.

Not a test. For the model given (`--model`, e.g. a random-weight checkpoint from bench/make_checkpoint.py),
the trainer's copy (bf16, on the GPU) is loaded first, then one Engine with rlgen's defaults plus the memory
saver (for `paused()`) and LoRA serving (for the adapter sync):

    start        Engine(...) until ready (once: a start is minutes at 7B), and the server's memory after it
    generate     64 prompts x 8 samples x 128 new tokens (ignore_eos), generated tokens/s
    pause        paused(): release (enter) and resume (exit) seconds, GPU memory used inside vs outside
    disk         trainer.save_pretrained(dir) + eng.update_weights_from_disk(dir): seconds of each
    tensors      eng.update_weights(trainer): end to end, rlgen's checks and serialization included
    adapter      eng.load_adapter(name, peft_model) from memory (rank 16, q/k/v/o), and from a directory

The syncs run interleaved per repeat in a shuffled order. Every synced version's logprobs of fixed
texts are compared with the same weights loaded by another way (tensors vs disk; adapter vs the
trainer's own forward), since random weights make greedy text meaningless. Medians with 90%
bootstrap intervals (`_common.bootstrap_median`).

    python bench/sizes.py --out sizes-1.7b.json --model /tmp/ckpt/llama-1.7b      # on the GPU machine
    python bench/sizes.py --out /tmp/s.json --backend cpu --quick --model <tiny-llama checkpoint>
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as C

REPEATS = 3
TEXTS = ["The capital of France is Paris.", "def add(a, b):\n    return a + b", "Once upon a time, a small fox",
         "1, 2, 3, 4, 5, 6, 7, 8"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def trainer_copy(model: str, device: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device)


def perturb(policy: Any, scale: float, seed: int) -> None:
    """Small noise on the norm weights: a changed model without rewriting every matrix."""
    import torch

    gen = torch.Generator(device=policy.device).manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.mul_(1 + scale * torch.randn(p.shape, generator=gen, device=p.device, dtype=p.dtype))


def fixed_logprobs(eng: Any, tok: Any, **kw: Any) -> list[float]:
    """Mean logprob per text of TEXTS (each text scored after a one-token prompt)."""
    prompts = [[tok.bos_token_id or 0] for _ in TEXTS]
    completions = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    res = eng.score(prompts, completions, **kw)
    return [float(v) for v in res.df["logprob_mean"]]


def max_abs_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def main() -> None:
    opened = C.begin(__doc__, "bench/sizes.py", report, repeats=REPEATS)
    if opened is None:
        return
    args, model, record = opened
    import torch

    import rlgen

    device = "cuda" if args.backend != "cpu" and torch.cuda.is_available() else "cpu"
    work = Path(tempfile.mkdtemp(prefix="rlgen-sizes-"))
    record.data.update(model=model, runs=[], checks={})
    t0 = time.monotonic()
    policy = trainer_copy(model, device)
    params = sum(p.numel() for p in policy.parameters())
    record.data.update(params=params, trainer_load_s=time.monotonic() - t0, trainer_device=device,
                       gpu_used_before_engine_mib=C.gpu_used_mib())
    C.log(f"trainer: {params / 1e9:.2f}B parameters on {device}")
    record.save()

    t0 = time.monotonic()
    eng = rlgen.Engine(model, backend=args.backend, progress=False, enable_memory_saver=True,
                       lora={"max_rank": 16, "target_modules": TARGETS, "max_loras_per_batch": 4})
    with eng:
        record.data.update(start_s=time.monotonic() - t0, start_times=eng.start_times,
                           gpu_used_after_engine_mib=C.gpu_used_mib(),
                           max_total_num_tokens=eng.server_info.get("max_total_num_tokens"),
                           cuda_graph_max_bs=eng.server_info.get("cuda_graph_max_bs"))
        C.log(f"engine started in {record['start_s']:.1f} s")
        record.save()
        tok = eng.tokenizer
        count = 16 if args.quick else 64
        new_tokens = 16 if args.quick else 128
        prompts = C.token_prompts(count, 64, seed=0)

        # generate: tokens/s of the base model, every repeat
        for rep in range(C.repeats_of(args)):
            t = time.monotonic()
            res = eng.generate(prompts, n=8, max_new_tokens=new_tokens, ignore_eos=True, logprobs=False)
            seconds = time.monotonic() - t
            tokens = int(res.df["completion_tokens"].sum())
            record["runs"].append({"step": "generate", "repeat": rep, "seconds": seconds, "tok_s": tokens / seconds})
            C.log(f"generate {rep}: {tokens / seconds:,.0f} tok/s")
            record.save()

        # pause: enter and exit seconds and memory inside
        if device == "cuda" or args.backend == "cpu":
            for rep in range(C.repeats_of(args)):
                outside = C.gpu_used_mib()
                t = time.monotonic()
                with eng.paused():
                    entered = time.monotonic() - t
                    inside = C.gpu_used_mib()
                    t = time.monotonic()
                exited = time.monotonic() - t
                record["runs"].append({"step": "pause", "repeat": rep, "release_s": entered, "resume_s": exited,
                                       "used_outside_mib": outside, "used_inside_mib": inside})
                C.log(f"pause {rep}: release {entered:.2f} s, resume {exited:.2f} s, {outside} -> {inside} MiB")
                record.save()

        # the adapter: PEFT on the trainer's GPU (a LoRA model of its own: the trainer's copy stays plain)
        import peft

        base_for_lora = trainer_copy(model, device)
        lora_model = peft.get_peft_model(base_for_lora, peft.LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS,
                                                                        init_lora_weights=False))
        with torch.no_grad():  # small B: an adapter that changes logprobs a little, like a trained one
            for name, p in lora_model.named_parameters():
                if "lora_B" in name:
                    p.mul_(0.01)
        lora_dir = work / "adapter"
        lora_model.save_pretrained(lora_dir)

        # the syncs, interleaved
        rng = random.Random(0)
        ckpt = work / "ckpt"
        for rep in range(C.repeats_of(args)):
            steps = ["disk", "tensors", "adapter", "adapter_dir"]
            rng.shuffle(steps)
            for step in steps:
                run: dict[str, Any] = {"step": step, "repeat": rep}
                if step == "disk":
                    perturb(policy, 0.02, seed=rep)
                    t = time.monotonic()
                    policy.save_pretrained(ckpt)
                    tok.save_pretrained(ckpt)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    run["save_s"] = time.monotonic() - t
                    t = time.monotonic()
                    eng.update_weights_from_disk(str(ckpt), weight_version=f"disk{rep}")
                    run["load_s"] = time.monotonic() - t
                    run["seconds"] = run["save_s"] + run["load_s"]
                    disk_lp = fixed_logprobs(eng, tok)
                    t = time.monotonic()
                    eng.update_weights(policy, weight_version=f"tensors-check{rep}")  # the same weights again
                    run["check_push_s"] = time.monotonic() - t
                    run["tensors_vs_disk_max_diff"] = max_abs_diff(disk_lp, fixed_logprobs(eng, tok))
                    shutil.rmtree(ckpt, ignore_errors=True)
                elif step == "tensors":
                    perturb(policy, 0.02, seed=100 + rep)
                    t = time.monotonic()
                    eng.update_weights(policy, weight_version=f"tensors{rep}")
                    run["seconds"] = time.monotonic() - t
                elif step == "adapter":
                    t = time.monotonic()
                    loaded = eng.load_adapter("policy", lora_model)
                    run["seconds"] = time.monotonic() - t
                    run["rlgen_reported_s"] = loaded.seconds
                else:
                    t = time.monotonic()
                    eng.load_adapter("from_dir", str(lora_dir))
                    run["seconds"] = time.monotonic() - t
                C.log(f"{step} {rep}: {run['seconds']:.3f} s" + (f" (save {run['save_s']:.2f} + load {run['load_s']:.2f})"
                                                                  if step == "disk" else ""))
                record["runs"].append(run)
                record.save()

        # the adapter served equals the trainer's own LoRA forward on fixed texts, over the checkpoint's
        # weights on both sides (the LoRA model's base was loaded from it and never changed)
        eng.update_weights_from_disk(model, weight_version="checkpoint")
        eng.load_adapter("policy", lora_model)
        served = fixed_logprobs(eng, tok, adapter="policy")
        served_base = fixed_logprobs(eng, tok)
        own = trainer_logprobs(lora_model, tok)
        record["checks"] = {"adapter_vs_trainer_max_diff": max_abs_diff(served, own),
                            "adapter_vs_base_max_diff": max_abs_diff(served, served_base),
                            "served_adapter": served, "trainer_adapter": own, "served_base": served_base}
        C.log(f"checks: {record['checks']}")
    record.data["gpu_used_after_close_mib"] = C.gpu_used_mib()
    shutil.rmtree(work, ignore_errors=True)
    report(record)
    record.save(complete=True)


def trainer_logprobs(model: Any, tok: Any) -> list[float]:
    """Mean logprob per text of TEXTS under `model` itself, as fixed_logprobs asks the server."""
    import torch

    out = []
    with torch.no_grad():
        for text in TEXTS:
            ids = [tok.bos_token_id or 0, *tok(text, add_special_tokens=False)["input_ids"]]
            x = torch.tensor([ids], device=model.device)
            logp = model(input_ids=x).logits[0, :-1].float().log_softmax(-1)
            out.append(float(logp.gather(-1, x[0, 1:, None]).mean()))
    return out


def report(record: C.Record) -> None:
    runs = record["runs"]
    print(f"model {record.data.get('model')}: {record.data.get('params', 0) / 1e9:.2f}B parameters; engine start "
          f"{C.fmt(record.data.get('start_s'), '.1f')} s; KV tokens {C.fmt(record.data.get('max_total_num_tokens'))}; "
          f"GPU used: trainer only {C.fmt(record.data.get('gpu_used_before_engine_mib'))} MiB, with the server "
          f"{C.fmt(record.data.get('gpu_used_after_engine_mib'))} MiB", flush=True)
    rows = []
    for step, key, name in (("generate", "tok_s", "generate tok/s (64 x 8 x 128)"),
                            ("pause", "release_s", "paused(): release s"), ("pause", "resume_s", "paused(): resume s"),
                            ("disk", "save_s", "disk: save_pretrained s"), ("disk", "load_s", "disk: update_weights_from_disk s"),
                            ("disk", "seconds", "disk: save + load s"), ("tensors", "seconds", "tensors: update_weights s"),
                            ("adapter", "seconds", "adapter: load_adapter(peft model) s"),
                            ("adapter_dir", "seconds", "adapter: load_adapter(directory) s")):
        values = [r[key] for r in runs if r["step"] == step and r.get(key) is not None]
        if not values:
            continue
        interval = C.bootstrap_median(values)
        spec = ",.0f" if key == "tok_s" else ".3f"
        rows.append([name, str(len(values)), C.fmt(statistics.median(values), spec),
                     "-" if interval is None else f"{C.fmt(interval[0], spec)}-{C.fmt(interval[1], spec)}",
                     C.fmt(min(values), spec), C.fmt(max(values), spec)])
    C.print_table("Medians (90% bootstrap interval)", ["step", "runs", "median", "interval", "min", "max"], rows)
    inside = [r["used_inside_mib"] for r in runs if r["step"] == "pause" and r.get("used_inside_mib") is not None]
    outside = [r["used_outside_mib"] for r in runs if r["step"] == "pause" and r.get("used_outside_mib") is not None]
    if inside and outside:
        print(f"GPU used outside paused() {statistics.median(outside):,.0f} MiB, inside {statistics.median(inside):,.0f} MiB "
              "(trainer's copies included)", flush=True)
    diffs = [r["tensors_vs_disk_max_diff"] for r in runs if "tensors_vs_disk_max_diff" in r]
    if diffs:
        print(f"same weights by tensors vs by disk, max |diff| of mean logprobs on {len(TEXTS)} texts: "
              f"{', '.join(f'{d:.4f}' for d in diffs)}", flush=True)
    checks = record.data.get("checks") or {}
    if checks:
        print(f"adapter served vs the trainer's LoRA forward: max |diff| {checks['adapter_vs_trainer_max_diff']:.4f} "
              f"(adapter vs base: {checks['adapter_vs_base_max_diff']:.4f})", flush=True)


if __name__ == "__main__":
    main()
