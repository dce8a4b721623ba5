"""`python -m rlgen`: the demo. Launch an engine on the default model, generate, print the DataFrame.

On a machine with a CUDA GPU and SGLang it runs SGLang; elsewhere rlgen's CPU backend.
"""

from __future__ import annotations

import argparse

import rlgen

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Name three primary colours."}],
    [{"role": "user", "content": "What is 12 times 12?"}],
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rlgen", description=__doc__)
    parser.add_argument("--model", default=None, help="a local HF checkout (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--backend", default="auto", choices=["auto", "sglang", "cpu"])
    parser.add_argument("-n", type=int, default=2, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args(argv)

    import pandas as pd

    with rlgen.Engine(args.model, backend=args.backend) as eng:
        print(eng)
        res = eng.generate(PROMPTS, n=args.n, max_new_tokens=args.max_new_tokens, temperature=0.7)
        print(res)
        with pd.option_context("display.max_colwidth", 60, "display.max_columns", None, "display.width", 250):
            print(res.df[["prompt_index", "sample_index", "completion", "finish_reason", "completion_tokens", "logprob_mean", "request_latency_s"]])
        shapes = {name: tuple(t.shape) for name, t in res.tensors().items()}
        print("tensors:", shapes)


if __name__ == "__main__":
    main()
