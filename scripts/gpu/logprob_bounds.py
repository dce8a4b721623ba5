"""On the GPU machine: what check_logprobs' bounds rest on, measured on SGLang.

For rollouts of 32, 128 and 512 new tokens (T = 1, 32 prompts x 4 samples): the per-token
|sampled - re-scored| logprob difference (max, p99, p99.9, mean, and the share of tokens over 1
nat), then the same comparison made wrong on purpose two ways: logprobs shifted by one token
(misaligned), and the rollouts re-scored after a small weight change (every weight moved by 1e-5
in a random direction, about one AdamW step at lr 1e-5: "stale weights"). Writes
$OUT/logprob_bounds.json and prints one line per case with check_logprobs' verdict.
Usage: python3 scripts/gpu/logprob_bounds.py   (after `source /tmp/rlgen-env.sh`)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch

import rlgen
from rlgen.compare._logprobs import check_verdict, compare_logprobs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _common as C

OUT = Path(os.environ.get("OUT", "."))
MODEL = os.environ["RLGEN_TEST_MODEL"]
PROMPTS = [[{"role": "user", "content": f"Tell me a story about the number {i}."}] for i in range(32)]


def stats(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    d = (a.double() - b.double()).abs()[mask & ~(a.isnan() | b.isnan())]
    q = torch.quantile(d, torch.tensor([0.99, 0.999], dtype=torch.float64)) if d.numel() else torch.zeros(2)
    return {"n_tokens": int(d.numel()), "max": float(d.max()), "p99": float(q[0]), "p999": float(q[1]),
            "mean": float(d.mean()), "share_over_1nat": float((d > 1.0).double().mean())}


def main() -> None:
    record = {"environment": C.environment(f"python3 {' '.join(sys.argv)}"), "cases": []}
    with rlgen.Engine(MODEL, backend="sglang", progress=False) as eng:
        runs = {}
        for length in (32, 128, 512):
            res = eng.generate(PROMPTS, n=4, max_new_tokens=length, temperature=1.0, logprobs=True, ignore_eos=True,
                               seed=length)
            rescored = eng.score(res)
            runs[length] = (res, rescored)
            mask = res.response_mask
            row = {"case": "same weights", "new_tokens": length, **stats(res.logprobs, rescored.logprobs, mask)}
            row["verdict"] = eng.check_logprobs(res).verdict
            record["cases"].append(row)
            # Misaligned: each sampled logprob paired with the next token's re-score.
            shifted = torch.roll(rescored.logprobs, shifts=-1, dims=1)
            m2 = mask.clone()
            m2[:, -1] = False
            m2 &= torch.roll(mask, shifts=-1, dims=1)
            row = {"case": "shifted by one", "new_tokens": length, **stats(res.logprobs, shifted, m2)}
            diffs = compare_logprobs(res.logprobs, shifted, mask=m2, off_by=1.0)
            row["verdict"] = check_verdict(diffs, reason=None, max_diff=1.0, mean_diff=0.05).verdict
            record["cases"].append(row)
        # Stale weights: every weight moved by 1e-5 in a random direction.
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1e-5 * torch.sign(torch.randn(p.shape, generator=gen)).to(p.dtype))
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            eng.tokenizer.save_pretrained(tmp)
            eng.update_weights_from_disk(tmp)
            for length, (res, _) in runs.items():
                stale = eng.score(res)
                row = {"case": "stale weights (1e-5 step)", "new_tokens": length,
                       **stats(res.logprobs, stale.logprobs, res.response_mask)}
                diffs = compare_logprobs(res, stale, off_by=1.0)
                row["verdict"] = check_verdict(diffs, reason=None, max_diff=1.0, mean_diff=0.05).verdict
                record["cases"].append(row)
    for row in record["cases"]:
        print(f"{row['case']:>26} {row['new_tokens']:>4} tok: max {row['max']:.3f} p99.9 {row['p999']:.3f} "
              f"mean {row['mean']:.4f} >1nat {row['share_over_1nat']:.4f} | {row['verdict'][:90]}")
    (OUT / "logprob_bounds.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
