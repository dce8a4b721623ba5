"""A 7B model with rlgen's default memory share, beside a trainer holding the same model (issue 26 §3).

Loads the random-weight Llama 7B checkpoint (bench/make_checkpoint.py) in bf16 on the GPU as a
notebook trainer would, then starts `rlgen.Engine(model)` with every default (gpu_memory_fraction
None: 0.2 plus the weights' share), and records the fraction it chose, the KV cache it got, the
start time and generate throughput (64 prompts x 8 samples x 128 tokens, 3 runs), and GPU memory.

    python scripts/gpu/default_7b.py --model /tmp/ckpt/llama-7b --out $OUT/default_7b.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _common as C


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    import rlgen

    C.site_flags()
    out: dict = {"environment": C.environment(), "model": args.model}
    trainer = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to("cuda")
    out["gpu_used_trainer_mib"] = C.gpu_used_mib()
    t0 = time.monotonic()
    with rlgen.Engine(args.model, backend="sglang", progress=False) as eng:
        out["start_s"] = time.monotonic() - t0
        argv = eng.info.get("command") or []
        out["mem_fraction_static"] = argv[argv.index("--mem-fraction-static") + 1] if "--mem-fraction-static" in argv else None
        out["kv_tokens"] = eng.server_info.get("max_total_num_tokens")
        out["gpu_used_with_server_mib"] = C.gpu_used_mib()
        prompts = C.token_prompts(64, 64, seed=0)
        runs = []
        for _ in range(3):
            t = time.monotonic()
            res = eng.generate(prompts, n=8, max_new_tokens=128, ignore_eos=True, logprobs=False)
            runs.append(int(res.df["completion_tokens"].sum()) / (time.monotonic() - t))
        out["tok_s"] = runs
        out["tok_s_median"] = statistics.median(runs)
        out["tok_s_interval"] = C.bootstrap_median(runs)
        pushed = time.monotonic()
        eng.update_weights(trainer, weight_version="trainer")
        out["push_s"] = time.monotonic() - pushed
    print(json.dumps({k: v for k, v in out.items() if k != "environment"}, default=str), flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
