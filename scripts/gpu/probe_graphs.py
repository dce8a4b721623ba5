"""Which SGLang server options give a correct greedy answer on this machine? (diagnostic)

Starts one Engine per configuration, in parallel (each takes 20% of the GPU), asks the greedy
capital-of-France question, and prints the answer with the start-up time.
usage: python scripts/gpu/probe_graphs.py
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import rlgen

CONFIGS = {
    "defaults": {},
    "defaults+memory_saver": {"enable_memory_saver": True},
    "no-piecewise+memory_saver": {"enable_memory_saver": True, "server_args": {"disable_piecewise_cuda_graph": True}},
    "no-cuda-graph": {"fast_start": True},
}
CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]


def probe(name: str) -> str:
    t0 = time.monotonic()
    try:
        with rlgen.Engine(os.environ["RLGEN_TEST_MODEL"], backend="sglang", progress=False, **CONFIGS[name]) as eng:
            started = time.monotonic() - t0
            one = eng.generate(CAPITAL, max_new_tokens=16, temperature=0).df.completion[0]
            batch = eng.generate([CAPITAL] * 3, max_new_tokens=16, temperature=0).df.completion.tolist()
            return f"{name:28s} start {started:5.1f}s  single={one!r}  batch-of-3 same={all(b == one for b in batch)} {batch[0]!r}"
    except Exception as err:  # report and go on
        return f"{name:28s} FAILED: {type(err).__name__}: {str(err)[:300]}"


if __name__ == "__main__":
    with ThreadPoolExecutor(len(CONFIGS)) as pool:
        for line in pool.map(probe, CONFIGS):
            print(line, flush=True)
