"""Seconds for the steps of an RL iteration that are not generation: `update_weights_from_disk`,
`paused()`'s release and resume, and saving a checkpoint, on one Engine.

Not a test. One Engine (memory saver on, so `paused()` works) serves the model; a second checkpoint
is the same model saved again by transformers with a tiny perturbation (so a load really changes
the weights). Each repeat, in a shuffled order:

    load        eng.update_weights_from_disk(the other checkpoint), alternating A and B
    release     eng.release_memory()       (paused()'s first half)
    resume      eng.resume_memory()        (paused()'s second half: reloads the weights too)
    save        model.save_pretrained(dir) of the trainer's copy (bf16), the step before a load

and a greedy generation after every load checks that the served weights are the ones loaded
(outputs of A and of B differ, and each repeats itself). Medians with 90% bootstrap intervals.

    python bench/weight_update.py --out weight_update.json                   # on the GPU machine
    python bench/weight_update.py --out /tmp/w.json --backend cpu --quick    # smoke test anywhere
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as C

REPEATS = 5
PROMPTS = ["What is the capital of France?", "List three fruits.", "Write one sentence about rain."]


def perturbed_copy(model: str, out: Path, device: str) -> Any:
    """The model with small noise on every matrix, saved to `out`; returns the trainer's copy."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).to(device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():
            if p.ndim == 2:
                p.add_(torch.randn(p.shape, generator=gen, device=device, dtype=p.dtype) * p.std() * 0.2)
    policy.save_pretrained(out)
    AutoTokenizer.from_pretrained(model).save_pretrained(out)
    return policy


def main() -> None:
    begun = C.begin(__doc__, "bench/weight_update.py", report, repeats=REPEATS)
    if begun is None:
        return
    args, model, record = begun
    import torch

    import rlgen

    device = "cuda" if torch.cuda.is_available() else "cpu"
    record.data.update(model=model, runs=[])
    work = Path(tempfile.mkdtemp(prefix="rlgen-weights-"))
    policy = perturbed_copy(model, work / "b", device)
    with rlgen.Engine(model, backend=args.backend, progress=False, enable_memory_saver=True, fast_start=True) as eng:
        checkpoints = {"a": model, "b": str(work / "b")}
        outputs: dict[str, list[list[int]]] = {}
        current = "a"
        rng = random.Random(0)
        for rep in range(C.repeats_of(args)):
            steps = ["load", "release+resume", "save"]
            rng.shuffle(steps)
            for step in steps:
                run: dict[str, Any] = {"repeat": rep, "step": step}
                if step == "load":
                    current = "b" if current == "a" else "a"
                    t0 = time.monotonic()
                    eng.update_weights_from_disk(checkpoints[current], weight_version=f"{current}-{rep}")
                    run["load_s"] = time.monotonic() - t0
                    ids = eng.generate(PROMPTS, max_new_tokens=16, temperature=0).id_lists("response")
                    run["weights"], run["same_as_before"] = current, outputs.setdefault(current, ids) == ids
                elif step == "release+resume":
                    t0 = time.monotonic()
                    eng.release_memory()
                    run["release_s"] = time.monotonic() - t0
                    t0 = time.monotonic()
                    eng.resume_memory()
                    run["resume_s"] = time.monotonic() - t0
                    ids = eng.generate(PROMPTS, max_new_tokens=16, temperature=0).id_lists("response")
                    run["same_as_before"] = outputs.setdefault(current, ids) == ids
                else:
                    t0 = time.monotonic()
                    policy.save_pretrained(work / "save-probe")
                    run["save_s"] = time.monotonic() - t0
                C.log(f"repeat {rep} {step}: " + ", ".join(f"{k} {v:.2f}" for k, v in run.items() if k.endswith("_s")))
                record["runs"].append(run)
                record.save()
        record["a_and_b_differ"] = outputs.get("a") != outputs.get("b") if len(outputs) == 2 else None
    report(record)
    record.save(complete=True)


def report(record: C.Record) -> None:
    runs = record["runs"]
    rows = []
    for key, name in (("load_s", "update_weights_from_disk"), ("release_s", "release (pause)"),
                      ("resume_s", "resume (weights reloaded)"), ("save_s", "save_pretrained (bf16)")):
        values = [r[key] for r in runs if key in r]
        if not values:
            continue
        interval = C.bootstrap_median(values)
        rows.append([name, str(len(values)), C.fmt(C.median_or_none(values), ".2f"),
                     "-" if interval is None else f"{interval[0]:.2f}-{interval[1]:.2f}",
                     C.fmt(min(values), ".2f"), C.fmt(max(values), ".2f")])
    C.print_table("Seconds per step (medians, 90% bootstrap interval)", ["step", "runs", "median", "interval", "min",
                                                                        "max"], rows)
    checks = [r.get("same_as_before") for r in runs if "same_as_before" in r]
    print(f"greedy outputs repeat after every load/resume: {all(checks)} ({len(checks)} checks); "
          f"A and B differ: {record.data.get('a_and_b_differ')}", flush=True)


if __name__ == "__main__":
    main()
