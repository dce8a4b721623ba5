"""Results to log without a server: a call's rows built from SGLang-shaped answers."""

from __future__ import annotations

from collections.abc import Sequence

from rlgen.rollouts import Rollouts, rollouts_from_responses


def answer(text: str, finish: str = "stop", *, start: int = 3) -> dict:
    ids = list(range(start, start + max(len(text), 1)))
    meta = {"id": "r", "finish_reason": {"type": finish, "matched": None}, "completion_tokens": len(ids),
            "output_token_logprobs": [[-0.5, i, None] for i in ids]}
    return {"text": text, "output_ids": ids, "meta_info": meta}


def call(completions: Sequence[Sequence[str]], *, rewards: Sequence[Sequence[float]] | None = None,
         finish: str = "stop", prompts: Sequence[str] | None = None) -> Rollouts:
    """One generate() call's result: prompt p ("question p", ids [10 + p, 11]) with the samples
    `completions[p]`, and a `reward` column when `rewards` is given."""
    n = len(completions[0])
    texts = list(prompts) if prompts is not None else [f"question {p}" for p in range(len(completions))]
    res = rollouts_from_responses([answer(c, finish) for group in completions for c in group],
                                  prompt_ids=[[10 + p, 11] for p in range(len(completions))], prompt_texts=texts,
                                  n=n, pad_token_id=0)
    if rewards is not None:
        res = res.with_columns({"reward": [r for group in rewards for r in group]})
    return res


def scored(completions: Sequence[Sequence[str]]) -> Rollouts:
    """A call scored by `says_yes` (1.0 when the completion is 'yes'), as a loop would log it."""
    return call(completions).add_rewards(says_yes, mode="inline", progress=False)


def says_yes(completion: str) -> float:
    return float(completion == "yes")
