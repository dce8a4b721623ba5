"""Weight versions without a server: the continuation of a sample across requests (its next request,
the finish of an aborted segment, stop strings across a boundary, the entry it becomes), the version
label of every token (`segment_versions`), the KV staleness of a row, the version index of the served
weights, the pause around an update (with a recording control), the options refused, and a result's
`versions` (tensor, selection, concat, parquet, the run log, the view coloured by version)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlgen
from rlgen.client._answer import read_answer
from rlgen.client._continuation import Boundary, Continued, StopRules, segment_versions, straddling_stop
from rlgen.core import _loop, _options
from rlgen.engine._pause import Pauses
from rlgen.engine._served import ServedWeights
from rlgen.rollouts import rollouts_from_responses

EOS = 2
# A toy tokenizer: token t is the letter chr(ord("a") + t % 26); EOS is special (dropped when skipping them).


def decode(ids: list[int], skip_special_tokens: bool = False) -> str:
    return "".join("" if t == EOS and skip_special_tokens else "</s>" if t == EOS else chr(97 + t % 26) for t in ids)


def answer(ids: list[int], finish: str, *, version: str = "v0", matched: Any = None, text: str | None = None,
           retractions: int = 0) -> Any:
    reason: dict[str, Any] = {"type": finish}
    if matched is not None:
        reason["matched"] = matched
    if finish == "abort":
        reason.update({"message": "Aborted", "status_code": None})
    return read_answer({"text": decode(ids, True) if text is None else text, "output_ids": ids, "meta_info": {
        "finish_reason": reason, "weight_version": version, "completion_tokens": len(ids),
        "num_retractions": retractions, "output_token_logprobs": [[-0.5 - t / 100, t, None] for t in ids]}})


def sample(max_new_tokens: int = 10, **sampling: Any) -> Continued:
    params = {"max_new_tokens": max_new_tokens, "temperature": 0.0, **sampling}
    return Continued([5, 6, 7], params, StopRules.of(params, eos_ids=[EOS]))


# -- the version label of each token ------------------------------------------------------------------
def test_a_segment_without_an_update_is_its_send_version_and_an_update_splits_it_where_the_stream_was() -> None:
    assert segment_versions(4, 3, [], None) == [3, 3, 3, 3]
    assert segment_versions(5, 0, [Boundary(3, 1, "in_place")], None) == [0, 0, 0, 1, 1]
    assert segment_versions(6, 0, [Boundary(1, 1, "retract"), Boundary(4, 2, "in_place")], 2) == [0, 1, 1, 1, 2, 2]
    assert segment_versions(3, 0, [Boundary(0, 1, "in_place")], 1) == [1, 1, 1]  # held at the gate: all new
    assert segment_versions(0, 0, [Boundary(0, 1, "abort")], 0) == []


def test_no_label_is_newer_than_the_version_the_answer_names() -> None:
    # An abort's answer, read after the update was recorded (it was in transit): all its tokens old.
    assert segment_versions(5, 0, [Boundary(2, 1, "abort")], 0) == [0, 0, 0, 0, 0]
    assert segment_versions(4, 1, [], 3) == [1, 1, 1, 1]  # a newer answer never raises a label


# -- the next request and the finish of an aborted segment ---------------------------------------------
def test_an_aborted_sample_goes_on_as_its_own_tokens_with_the_rest_of_its_budget() -> None:
    s = sample(10, min_new_tokens=6)
    ids, params = s.next_request()
    assert ids == [5, 6, 7] and params["max_new_tokens"] == 10 and params is s.sampling
    s.open("r1", 0)
    s.close(answer([10, 11, 12, 13], "abort"), answered_version=0, decode=decode)
    assert not s.done
    ids, params = s.next_request()
    assert ids == [5, 6, 7, 10, 11, 12, 13]
    assert params["max_new_tokens"] == 6 and params["min_new_tokens"] == 2 and params["temperature"] == 0.0
    assert s.sampling["max_new_tokens"] == 10  # the first request's parameters are left as they were
    s.open("r2", 1)
    s.close(answer([14, 15, EOS], "stop", version="v1", matched=EOS), answered_version=1, decode=decode)
    assert s.done and s.finish == {"type": "stop", "matched": EOS}
    assert s.ids == [10, 11, 12, 13, 14, 15, EOS] and s.versions == [0, 0, 0, 0, 1, 1, 1]
    assert [t[1] for t in s.logprobs] == s.ids  # every logprob entry still names its token
    entry = s.entry(decode)
    assert entry["output_ids"] == s.ids and entry["text"] == decode(s.ids[:-1], True) == "klmnop"
    assert [seg["rid"] for seg in entry["meta_info"]["segments"]] == ["r1", "r2"]
    assert entry["meta_info"]["completion_tokens"] == 7 and entry["meta_info"]["prompt_tokens"] == 3


def test_an_abort_whose_last_token_is_eos_is_a_stop_and_one_at_the_budget_is_a_length() -> None:
    s = sample(10)
    s.open("r", 0)
    s.close(answer([10, EOS], "abort"), answered_version=0, decode=decode)
    assert s.finish == {"type": "stop", "matched": EOS}
    s = sample(3)
    s.open("r", 0)
    s.close(answer([10, 11, EOS], "abort"), answered_version=0, decode=decode)
    assert s.finish == {"type": "length", "length": 3}  # SGLang checks the length first, as the server does
    s = sample(10, stop_token_ids=[11])
    s.open("r", 0)
    s.close(answer([10, 11], "abort"), answered_version=0, decode=decode)
    assert s.finish == {"type": "stop", "matched": 11}


def test_an_abort_on_eos_goes_on_under_ignore_eos_or_before_min_new_tokens() -> None:
    for s in (sample(10, ignore_eos=True), sample(10, min_new_tokens=5)):
        s.open("r", 0)
        s.close(answer([10, EOS], "abort"), answered_version=0, decode=decode)
        assert not s.done, s.rules


def test_a_stop_string_across_two_segments_ends_the_sample_where_it_completes() -> None:
    s = sample(20, stop=["cat"])
    s.open("r1", 0)
    s.close(answer([10, 2 + 26, 0], "abort"), answered_version=0, decode=decode)  # "k" "c" "a": no match yet
    assert not s.done
    s.open("r2", 1)
    # The server does not see "ca" (its prompt) + "t": it goes on past the match.
    s.close(answer([19, 20, 21], "length", version="v1"), answered_version=1, decode=decode)
    assert s.finish == {"type": "stop", "matched": "cat"}
    assert s.ids == [10, 28, 0, 19] and s.versions == [0, 0, 0, 1] and len(s.logprobs) == 4
    assert s.dropped == 2 and s.entry(decode)["text"] == "k"  # cut at the stop string, as SGLang's text
    assert straddling_stop([0, 1, 2], 1, ["zz"], decode) is None


def test_a_failed_segment_ends_the_sample_with_its_tokens_and_a_turned_away_one_is_forgotten() -> None:
    s = sample(10)
    s.open("r1", 0)
    s.close(answer([10, 11], "abort"), answered_version=0, decode=decode)
    s.open("r2", 0)
    s.drop_open()  # HTTP 499: the pause turned it away before it sampled anything
    assert len(s.segments) == 1 and s.next_request()[0] == [5, 6, 7, 10, 11]
    s.open("r3", 0)
    s.close(answer([], "error", text=""), answered_version=0, decode=decode)
    assert s.finish is not None and s.finish["type"] == "error" and s.ids == [10, 11]


def test_a_sample_of_one_request_keeps_the_servers_own_text() -> None:
    s = sample(10)
    s.open("r", 0)
    s.close(answer([10, 11, EOS], "stop", matched=EOS, text="as the server says"), answered_version=0,
            decode=decode)
    assert s.entry(decode)["text"] == "as the server says"


def test_kv_staleness_is_old_kv_after_an_in_place_update_and_old_prefix_after_retract_or_a_stale_cache() -> None:
    def run(mode: str, *, kv: str = "fresh", received: int = 1) -> str:
        s = sample(10)
        seg = s.open("r", 0, kv=kv)
        seg.boundaries.append(Boundary(received, 1, mode))
        s.close(answer([10, 11, 12], "length", version="v1"), answered_version=1, decode=decode)
        return s.kv()

    assert run("in_place") == "old_kv"
    assert run("retract") == "old_prefix"
    assert run("abort") == "fresh"
    assert run("abort", kv="old_prefix") == "old_prefix"
    assert run("in_place", received=3) == "fresh"  # every token came before the update
    assert run("unsent", received=0) == "fresh"  # the request had not left: no token saw the old KV


def test_the_sender_awaits_ready_before_a_sequence_joins_and_marks_what_has_left() -> None:
    from rlgen.client._sender import Sender

    class Client:
        one_prompt_per_request = False

        async def generate_stream(self, body: dict[str, Any]) -> Any:
            seen.append(set(sender.posted))
            for i, rid in enumerate(body["rid"]):
                yield {"index": i, "text": "", "output_ids": [1], "meta_info": {
                    "id": rid, "finish_reason": {"type": "length"}, "completion_tokens": 1}}

    seen: list[set[str]] = []
    gate = asyncio.Event()

    async def main() -> list[Any]:
        async def ready() -> None:
            await gate.wait()

        tasks = [asyncio.ensure_future(sender.sample([1, 2], {}, rid=f"r{i}", ready=ready)) for i in range(2)]
        await asyncio.sleep(0.1)
        assert sender.batches == [] and not sender.posted  # held at `ready`: nothing sent
        gate.set()
        return await asyncio.gather(*tasks)

    sender = Sender(Client(), members=2)  # type: ignore[arg-type]
    answers = asyncio.run(main())
    assert [a["meta_info"]["id"] for a, _ in answers] == ["r0", "r1"]
    assert seen == [{"r0", "r1"}] and not sender.posted


# -- the version index of the served weights ------------------------------------------------------------
def test_the_version_index_counts_changes_and_maps_the_servers_strings_from_a_requests_own_version_on() -> None:
    w = ServedWeights("/nowhere", hashable=False)
    w.connected("default")
    assert w.index == 0 and w.labels == ["default"] and w.index_of("default") == 0
    w.version = "tensors@1"
    assert w.advance() == 1
    w.version = "default"  # a reload under the old name: a version of its own
    assert w.advance() == 2
    assert w.labels == ["default", "tensors@1", "default"]
    assert w.index_of("default", at_least=0) == 0 and w.index_of("default", at_least=1) == 2
    assert w.index_of("tensors@1", at_least=2) is None and w.index_of(None) is None


# -- the pause around an update ---------------------------------------------------------------------------
class Control:
    """A ServerControl that records its control requests."""

    def __init__(self, fail: str | None = None) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail

    async def apost(self, path: str, body: dict[str, Any], *, what: str, **_: Any) -> Any:
        self.posts.append((path, body))
        if path == self.fail:
            raise rlgen.RequestError(f"{path} failed")
        return {}

    def post(self, path: str, body: dict[str, Any], *, what: str, **_: Any) -> Any:
        return _loop.run_sync(self.apost(path, body, what=what))


class Listener:
    def __init__(self) -> None:
        self.told: list[tuple[int, str]] = []

    def updated(self, version: int, mode: str) -> None:
        self.told.append((version, mode))


def weights() -> ServedWeights:
    w = ServedWeights("/nowhere", hashable=False)
    w.connected("default")
    return w


def test_no_pause_without_a_job_and_abort_while_one_runs_which_may_flush_the_cache() -> None:
    pauses, control, w = Pauses(), Control(), weights()
    with pauses.pausing(None, control=control, weights=w) as ticket:  # type: ignore[arg-type]
        assert ticket.mode is None and ticket.flush_cache
    assert control.posts == []
    job = Listener()
    pauses.register(job)
    with pauses.pausing(None, control=control, weights=w) as ticket:  # type: ignore[arg-type]
        assert ticket.mode == "abort" and ticket.flush_cache and pauses.paused
        w.version = "new"
        w.advance()
    assert control.posts == [("/pause_generation", {"mode": "abort"}), ("/continue_generation", {})]
    assert job.told == [(1, "abort")] and not pauses.paused and pauses.epoch == 1 and not pauses.old_prefixes


def test_retract_and_in_place_must_not_flush_and_leave_old_prefixes_in_the_cache() -> None:
    for mode in ("retract", "in_place"):
        pauses, control, w = Pauses(), Control(), weights()
        with pauses.pausing(mode, control=control, weights=w) as ticket:  # type: ignore[arg-type]
            assert not ticket.flush_cache
            w.advance()
        assert pauses.old_prefixes and control.posts[0] == ("/pause_generation", {"mode": mode})
        pauses.flushed()
        assert not pauses.old_prefixes


def test_a_failed_update_or_ctrl_c_continues_the_server_and_opens_the_gate_and_tells_no_job() -> None:
    for error in (rlgen.RequestError("push failed"), KeyboardInterrupt()):
        pauses, control, w, job = Pauses(), Control(), weights(), Listener()
        pauses.register(job)
        with pytest.raises(type(error)), pauses.pausing("in_place", control=control, weights=w):  # type: ignore[arg-type]
            raise error
        assert [p for p, _ in control.posts] == ["/pause_generation", "/continue_generation"]
        assert not pauses.paused and job.told == [] and w.index == 0 and not pauses.old_prefixes


def test_a_failing_continue_still_opens_the_gate() -> None:
    pauses, control, w = Pauses(), Control(fail="/continue_generation"), weights()
    with pytest.raises(rlgen.RequestError), pauses.pausing("abort", control=control, weights=w):  # type: ignore[arg-type]
        pass
    assert not pauses.paused


def test_requests_wait_at_the_gate_while_a_pause_lasts() -> None:
    pauses, control, w = Pauses(), Control(), weights()
    released: list[float] = []

    async def waiter() -> None:
        await pauses.wait_open()
        released.append(1.0)

    with pauses.pausing("abort", control=control, weights=w):  # type: ignore[arg-type]
        future = asyncio.run_coroutine_threadsafe(waiter(), _loop.get_loop())
        with contextlib.suppress(Exception):
            future.result(timeout=0.2)
        assert released == []
    future.result(timeout=5)
    assert released == [1.0]


def test_reattaching_continues_a_server_a_dead_kernel_left_paused_and_minds_no_missing_route() -> None:
    control = Control()
    Pauses.continue_after_attach(control)  # type: ignore[arg-type]
    assert control.posts == [("/continue_generation", {})]
    Pauses.continue_after_attach(Control(fail="/continue_generation"))  # type: ignore[arg-type]


# -- options refused before anything is sent --------------------------------------------------------------
@pytest.mark.parametrize("value", ["inplace", "pause", 1, True])
def test_an_unknown_pause_mode_is_refused(value: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        _options.resolve(_options.PauseOptions, {"pause": value})


@pytest.mark.parametrize("value", [0, 0.0, -0.5, 1.01, float("nan"), "half", True])
def test_min_done_outside_zero_one_is_refused(value: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="min_done"):
        _options.resolve(_options.JobResultOptions, {"min_done": value})
    assert _options.resolve(_options.JobResultOptions, {"min_done": 1})["min_done"] == 1.0
    with pytest.raises(ValueError, match="rest"):
        _options.resolve(_options.JobResultOptions, {"rest": "hand_back"})


# -- a result's versions ------------------------------------------------------------------------------------
def plain() -> rlgen.Rollouts:
    """A result made without versions (by hand)."""
    entries = [{"text": decode(o), "output_ids": o, "meta_info": {"finish_reason": {"type": "length"}}}
               for o in ([10, 11], [13])]
    return rollouts_from_responses(entries, prompt_ids=[[1, 3], [4]], n=1, pad_token_id=0)


def three(token_versions: list[list[int]]) -> rlgen.Rollouts:
    outs = [[10, 11, 12], [13], [14, 15]]
    entries = [{"text": decode(o), "output_ids": o, "meta_info": {
        "finish_reason": {"type": "length"}, "output_token_logprobs": [[-1.0, t, None] for t in o]}} for o in outs]
    return rollouts_from_responses(entries, prompt_ids=[[1, 3], [4], [5]], n=1, pad_token_id=0,
                                   token_versions=token_versions, prompt_numbers=[4, 7, 9], run="job")


def test_versions_are_an_int64_tensor_aligned_with_the_logprobs_with_minus_one_on_padding() -> None:
    res = three([[0, 0, 1], [2], [1, 1]])
    assert res.versions is not None and res.versions.dtype.is_floating_point is False
    assert res.versions.tolist() == [[0, 0, 1], [2, -1, -1], [1, 1, -1]]
    assert res.versions.shape == res.logprobs.shape == res.response_ids.shape
    assert res.df.prompt_index.tolist() == [4, 7, 9] and res.df.row_id.tolist() == [4, 7, 9]
    assert set(res.df.run) == {"job"}
    assert res[[2, 0]].versions.tolist() == [[1, 1, -1], [0, 0, 1]]
    with pytest.raises(ValueError, match="token_versions"):
        three([[0], [2], [1, 1]])


def test_versions_survive_concat_parquet_and_the_run_log(tmp_path: Path) -> None:
    res = three([[0, 0, 1], [2], [1, 1]])
    other = plain()
    assert other.versions is None
    joined = rlgen.Rollouts.concat([res, other])
    assert joined.versions.tolist()[3:] == [[-1, -1, -1], [-1, -1, -1]]  # not known: as padding
    res.to_parquet(tmp_path / "r.parquet")
    back = rlgen.Rollouts.from_parquet(tmp_path / "r.parquet")
    assert back.versions.tolist() == res.versions.tolist()
    log = rlgen.RolloutLog.create(tmp_path / "run")
    log.append(3, res)
    assert log.load(3).versions.tolist() == res.versions.tolist()


def test_the_view_colours_tokens_by_version_with_a_legend_and_refuses_a_result_without_versions() -> None:
    res = three([[0, 0, 1], [2], [1, 1]])
    page = res.view(color="version").html
    assert page.count("| version 0") == 2 and page.count("| version 1") == 3 and page.count("| version 2") == 1
    from rlgen.rollouts._token_html import version_color

    assert page.count(f"background:{version_color(1)}") == 3 + 1  # three tokens and the legend's swatch
    assert version_color(0) != version_color(1) != version_color(2)
    assert res.view().html == res._repr_html_()
    with pytest.raises(ValueError, match="color"):
        res.view(color="versions")
    with pytest.raises(ValueError, match="no weight versions"):
        plain().view(color="version")
    assert np.asarray(res.tokens(0)["versions"]).tolist() == [0, 0, 1]


def test_the_view_shows_the_version_columns_only_where_they_say_something() -> None:
    """A call no weight update touched (one version, nothing stale) keeps them in the df, out of the
    data cells; a row sampled across a push, or a stale one, shows them."""
    res = three([[0, 0, 1], [2], [1, 1]])
    columns = {"version_min": [0, 2, 1], "version_max": [1, 2, 1], "staleness": [2, 0, 1], "n_segments": [2, 1, 1]}
    shown = res.with_columns(columns).view().html
    assert "version_min" in shown and "n_segments" in shown
    quiet = res.with_columns({"version_min": [0, 0, 0], "version_max": [0, 0, 0], "staleness": [0, 0, 0],
                              "n_segments": [1, 1, 1]})
    page = quiet.view().html
    assert "version_min" not in page and "n_segments" not in page and "more columns" not in page
    assert quiet.df.version_min.tolist() == [0, 0, 0]  # still in the df
    stale = quiet.with_columns({"staleness": [0, 1, 0]})
    assert "version_min" in stale.view().html
