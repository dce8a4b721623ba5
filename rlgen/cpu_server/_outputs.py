"""What a sequence says: the CPU backend's stop conditions, output text and `SeqOutput` snapshots.

Owns: when a sequence stops (SGLang's order: length, then stop tokens, then stop strings, looked
for in the decoded tail), its text as a client sees it (a matched stop token dropped, the text cut
at a matched stop string unless no_stop_trim, an incomplete UTF-8 character held back while
streaming), whether a streamed chunk may be the start of a stop string, the snapshots (results and
errors) built from a `Seq`, and their delivery to a job's sink, which must never take the
scheduler down. Knows nothing about tensors, batching, the model, the scheduler's queue or HTTP:
it reads a `Seq` and a tokenizer (the scheduler thread's own).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from rlgen.cpu_server._batch import Seq
from rlgen.cpu_server._jobs import Job, SeqOutput

__all__ = ["check_finished", "deliver", "ends_with_stop_prefix", "error_output", "snapshot", "stop_tail"]

logger = logging.getLogger("rlgen.cpu_server")


def stop_tail(tokenizer: Any, job: Job) -> int:
    """SGLang decodes the last stop_str_max_len + 1 tokens to look for stop strings."""
    if not job.params.stop:
        return 0
    return max(len(tokenizer.encode(s, add_special_tokens=False)) for s in job.params.stop) + 1


def check_finished(seq: Seq, tokenizer: Any, eos_token_ids: list[int]) -> dict[str, Any] | None:
    """SGLang's Req.check_finished order: length, then stop tokens, then stop strings."""
    params = seq.job.params
    token = seq.output_ids[-1]
    if len(seq.output_ids) >= params.max_new_tokens:
        return {"type": "length", "length": params.max_new_tokens}
    if not params.ignore_eos and (token in params.stop_token_ids or token in eos_token_ids):
        return {"type": "stop", "matched": token}
    if params.stop:
        tail = cast(str, tokenizer.decode(seq.output_ids[-seq.stop_tail_tokens :]))
        for stop in params.stop:
            if stop in tail:
                return {"type": "stop", "matched": stop}
    return None


def snapshot(seq: Seq, tokenizer: Any) -> SeqOutput:
    job = seq.job
    reason = seq.finish_reason
    ids = seq.output_ids
    # The text drops a matched stop token and is cut at a matched stop string (SGLang's
    # detokenizer trim_matched_stop); output_ids keep everything.
    text_ids = ids
    if reason and not job.params.no_stop_trim and isinstance(reason.get("matched"), int) and reason["matched"]:
        text_ids = ids[:-1]
    text = cast(str, tokenizer.decode(text_ids, skip_special_tokens=job.params.skip_special_tokens))
    if reason is None:
        text = text.rstrip("\ufffd")  # hold back an incomplete UTF-8 character while streaming
    elif isinstance(reason.get("matched"), str) and not job.params.no_stop_trim:
        cut = text.find(reason["matched"])
        text = text[:cut] if cut != -1 else text
    return SeqOutput(
        rid=job.rid,
        prompt_tokens=len(job.input_ids),
        output_ids=list(ids),
        text=text,
        finish_reason=reason,
        input_token_logprobs=list(seq.in_logprobs) if seq.in_logprobs is not None else None,
        input_top_logprobs=list(seq.in_top) if seq.in_top is not None else None,
        output_token_logprobs=list(seq.out_logprobs) if job.return_logprob else None,
        output_top_logprobs=list(seq.out_top) if job.return_logprob and job.top_logprobs_num > 0 else None,
        cached_tokens=seq.cached_tokens,
        num_retractions=seq.num_retractions,
    )


def ends_with_stop_prefix(text: str, stops: tuple[str, ...]) -> bool:
    return any(text.endswith(stop[:k]) for stop in stops for k in range(1, len(stop)))


def error_output(seq: Seq, message: str, *, status: int = 500) -> SeqOutput:
    return SeqOutput(
        rid=seq.job.rid,
        prompt_tokens=len(seq.job.input_ids),
        output_ids=list(seq.output_ids),
        text="",
        finish_reason=None,
        error=(status, message),
        cached_tokens=seq.cached_tokens,
    )


def deliver(sink: Callable[[SeqOutput], None], output: SeqOutput) -> None:
    """Call a job's sink; a broken sink must not take the scheduler down."""
    try:
        sink(output)
    except Exception:
        logger.exception("Result sink failed for rid=%s", output.rid)
