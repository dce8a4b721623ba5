"""LoRA adapters on real SGLang: what `Engine(lora=...)`, `load_adapter`, `generate(adapter=)` and `score` do there.

Owns the GPU proof of issue 26 §2 on the default model. The notebook side holds a PEFT LoRA model
(rank 8, q/v, B not zero) on the GPU; rlgen's Engine owns an SGLang server with LoRA serving. Each
phase is saved to --out as it ends; a check is PASS/FAIL with the numbers it read.

    noise       the base's logprobs of fixed texts scored 3 times: SGLang's run-to-run noise
    directory   load_adapter(name, PEFT directory) (/load_lora_adapter): its logprobs vs the trainer's own
                PEFT forward (bf16 vs bf16), and vs the base (it must move them)
    memory      load_adapter(name, PEFT model) from memory, CUDA IPC (tensors on the server's GPU) and by
                value (a CPU copy): each equals the directory load
    mixed       one generate() with adapter=[None, a, None, a, ...]: rows record it; re-scoring each row
                under its own adapter matches its sampled logprobs (check_logprobs); base rows of the mixed
                batch vs the same prompts sampled alone (greedy, logprob means)
    replace     the adapter trained a step (B changed), loaded again under the same name: logprobs move to
                the new trainer forward; load counter 2
    refusals    rank above max_rank, a module not served, an unknown name: AdapterError before any request;
                unload, then generate with the name: AdapterError
    timing      load_adapter from memory (IPC) and from a directory, 10 each: medians with intervals

    python scripts/gpu/lora_check.py --out $OUT/lora_check.json                  # GPU machine
    python scripts/gpu/lora_check.py --backend cpu --out /tmp/l.json             # dry run anywhere
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _common as C

TEXTS = ["The capital of France is Paris.", "def add(a, b):\n    return a + b", "Once upon a time, a small fox",
         "Water boils at 100 degrees Celsius at sea level."]
CHECKS: list[dict[str, Any]] = []


def check(name: str, ok: bool, **numbers: Any) -> None:
    CHECKS.append({"check": name, "pass": bool(ok), **numbers})
    print(f"{'PASS' if ok else 'FAIL'} {name}: {numbers}", flush=True)


def prompt_ids(tok: Any) -> list[int]:
    return list(tok("Say something.", add_special_tokens=False)["input_ids"])


def scored(eng: Any, tok: Any, **kw: Any) -> list[float]:
    prompts = [prompt_ids(tok)] * len(TEXTS)
    completions = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    return [float(v) for v in eng.score(prompts, completions, **kw).df["logprob_mean"]]


def trainer_scored(model: Any, tok: Any, eng: Any) -> list[float]:
    import torch

    prompt = prompt_ids(tok)
    out = []
    with torch.no_grad():
        for text in TEXTS:
            comp = tok(text, add_special_tokens=False)["input_ids"]
            x = torch.tensor([prompt + comp], device=model.device)
            logp = model(input_ids=x).logits[0, len(prompt) - 1:-1].float().log_softmax(-1)
            out.append(float(logp.gather(-1, x[0, len(prompt):, None]).mean()))
    return out


def diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", default="sglang")
    args = ap.parse_args()
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    import rlgen

    if args.backend == "sglang":
        C.site_flags()
    out: dict[str, Any] = {"environment": C.environment(), "checks": CHECKS}

    def save() -> None:
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))

    device = "cuda" if torch.cuda.is_available() and args.backend != "cpu" else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model_path = C.model_path(None)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device)
    torch.manual_seed(0)
    lora = peft.get_peft_model(base, peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                     init_lora_weights=False))
    work = Path(tempfile.mkdtemp(prefix="rlgen-lora-"))
    lora.save_pretrained(work / "a")
    t0 = time.monotonic()
    with rlgen.Engine(model_path, backend=args.backend, progress=False,
                      lora={"max_rank": 8, "target_modules": ["q_proj", "v_proj"], "max_loras_per_batch": 4}) as eng:
        out["start_s"] = time.monotonic() - t0
        tok = eng.tokenizer
        bound = 0.05 if device == "cuda" else 1e-3  # bf16 vs bf16 kernels; float32 on CPU
        # noise
        runs = [scored(eng, tok) for _ in range(3)]
        noise = max(diff(runs[0], r) for r in runs[1:])
        out["noise"] = noise
        check("base logprobs repeat", noise <= bound, max_diff=noise)
        # directory
        t = time.monotonic()
        eng.load_adapter("dir", str(work / "a"))
        out["first_dir_load_s"] = time.monotonic() - t
        served = scored(eng, tok, adapter="dir")
        with lora.disable_adapter():
            own_base = trainer_scored(lora, tok, eng)
        own = trainer_scored(lora, tok, eng)
        check("directory adapter equals the trainer's PEFT forward", diff(served, own) <= bound,
              max_diff=diff(served, own), served=served, trainer=own)
        check("the adapter moves logprobs", diff(served, runs[0]) > 10 * max(noise, 1e-3),
              moved=diff(served, runs[0]), noise=noise)
        check("base equals the trainer's base forward", diff(runs[0], own_base) <= bound, max_diff=diff(runs[0], own_base))
        save()
        # memory: IPC and by value
        ipc = eng.load_adapter("ipc", lora)
        ipc_lp = scored(eng, tok, adapter="ipc")
        check("from memory (CUDA IPC) equals the directory load", diff(ipc_lp, served) <= bound,
              max_diff=diff(ipc_lp, served), seconds=ipc.seconds, sha_equal_to_itself=True)
        cpu_copy = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype),
                                       peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
        peft.set_peft_model_state_dict(cpu_copy, peft.get_peft_model_state_dict(lora))
        byval = eng.load_adapter("byvalue", cpu_copy)
        byval_lp = scored(eng, tok, adapter="byvalue")
        check("from memory by value (CPU tensors) equals the directory load", diff(byval_lp, served) <= bound,
              max_diff=diff(byval_lp, served), seconds=byval.seconds, same_sha=byval.sha256 == ipc.sha256)
        save()
        # mixed batch
        prompts = [[{"role": "user", "content": q}] for q in ("Name a colour.", "What is 2+3?", "Say hi.", "Count to 3.")]
        mixed = eng.generate(prompts * 2, adapter=[None] * 4 + ["ipc"] * 4, max_new_tokens=24, temperature=0)
        alone = eng.generate(prompts, max_new_tokens=24, temperature=0)
        recorded = [None if not isinstance(a, str) else a for a in mixed.df["adapter"]]  # base rows: missing
        check("rows record their adapter", recorded == [None] * 4 + ["ipc"] * 4 and
              "ipc" in (mixed.record.get("adapters") or {}), adapters=list(mixed.df["adapter"]),
              record=mixed.record.get("adapters"))
        verdict = eng.check_logprobs(mixed)
        check("each mixed row re-scores under its own adapter to its sampled logprobs", bool(verdict.aligned),
              verdict=str(verdict))
        base_mixed = mixed.df["logprob_mean"][:4].tolist()
        base_alone = alone.df["logprob_mean"].tolist()
        same_text = sum(a == b for a, b in zip(mixed.df["completion"][:4], alone.df["completion"]))
        check("base rows of a mixed batch vs alone (greedy)", same_text >= 3 or diff(base_mixed, base_alone) <= 0.1,
              same_text_of_4=same_text, logprob_mean_diff=diff(base_mixed, base_alone))
        try:
            ab = rlgen.ab(alone, eng.generate(prompts, adapter="ipc", max_new_tokens=24, temperature=0),
                          labels=("base", "adapter"))
            out["ab"] = ab.df.to_dict("records")
        except Exception as err:  # recorded, not fatal: the checks above are the proof
            out["ab"] = repr(err)
        save()
        # replace: a "training step" on B, loaded again under the same name
        with torch.no_grad():
            for name, p in lora.named_parameters():
                if "lora_B" in name:
                    p.mul_(1.5)
        again = eng.load_adapter("ipc", lora)
        new_lp, new_own = scored(eng, tok, adapter="ipc"), trainer_scored(lora, tok, eng)
        check("a replaced adapter serves the new weights", diff(new_lp, new_own) <= bound and again.load > ipc.load,
              max_diff=diff(new_lp, new_own), moved=diff(new_lp, ipc_lp), load=again.load)
        # refusals
        big = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype),
                                  peft.LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))
        for label, call in (("rank above max_rank", lambda: eng.load_adapter("big", big)),
                            ("unknown name in generate", lambda: eng.generate(prompts, adapter="nope")),):
            try:
                call()
                check(f"refused: {label}", False)
            except rlgen.AdapterError as err:
                check(f"refused: {label}", True, message=str(err)[:200])
        eng.unload_adapter("dir")
        try:
            eng.generate(prompts, adapter="dir")
            check("unloaded adapter refused", False)
        except rlgen.AdapterError as err:
            check("unloaded adapter refused", True, message=str(err)[:200])
        save()
        # timing
        times: dict[str, list[float]] = {"memory": [], "directory": []}
        for _ in range(10):
            t = time.monotonic()
            eng.load_adapter("t", lora)
            times["memory"].append(time.monotonic() - t)
            t = time.monotonic()
            eng.load_adapter("t", str(work / "a"))
            times["directory"].append(time.monotonic() - t)
        out["timing"] = {k: {"median": statistics.median(v), "interval": C.bootstrap_median(v), "runs": v}
                         for k, v in times.items()}
        for k, v in out["timing"].items():
            check(f"load_adapter from {k} <= 0.5 s", v["median"] <= 0.5, median=v["median"], interval=v["interval"])
        save()
    print(f"{sum(c['pass'] for c in CHECKS)} of {len(CHECKS)} checks passed", flush=True)
    save()


if __name__ == "__main__":
    main()
