"""`Episodes`, the result of `Engine.episodes`, as a `Rollouts`: rows, records, tensors whose masks
make the loss, selection, concat, parquet, rewards over message lists, group statistics, re-scoring
and `rlgen.compare` over sampled tokens only, the drift columns. One real CPU server per module."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import rlgen
from rlgen.core._columns import COLUMNS, EPISODE_COLUMNS
from rlgen.episodes import ROLE_CODES, Episodes, episodes_from_records

BACKEND = os.environ.get("RLGEN_TEST_BACKEND", "cpu")
PROMPTS = ["What is 2+2?", "Name a colour."]


def twice(messages: list[dict[str, Any]], data: Any) -> str:
    """Asks once more, then ends: two assistant turns, one environment message between them."""
    return "Are you sure?" if sum(m["role"] == "assistant" for m in messages) < 2 else "done"


@pytest.fixture(scope="module")
def engine(model_path: str):
    eng = rlgen.Engine(model_path, backend=BACKEND, progress=False)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def res(engine: rlgen.Engine) -> Episodes:
    return engine.episodes(PROMPTS, env=twice, n=2, max_turns=3, max_new_tokens=6, temperature=1.0,
                           sampling_seed=7, data={"answer": ["4", "red"]})


@pytest.mark.timeout(180)
def test_a_row_per_episode_with_rlgens_columns_then_the_episodes_then_the_data(res: Episodes) -> None:
    assert isinstance(res, rlgen.Rollouts) and len(res) == 4
    cols = list(res.df.columns)
    assert cols[:len(COLUMNS)] == list(COLUMNS)
    assert [c for c in cols if c in EPISODE_COLUMNS] == [c for c in EPISODE_COLUMNS if c in cols]
    assert cols[-1] == "answer" and res.data_columns == ["answer"]
    df = res.df
    assert (df.status == "done").all() and (df.turns == 2).all()
    for i, r in enumerate(res.records):
        assert df.completion[i] == r.assistant_turns[-1]["text"]            # the episode's answer
        assert df.completion_messages[i] == r.messages[r.n_prompt_messages:]
        assert [m["role"] for m in df.completion_messages[i]] == ["assistant", "user", "assistant"]
        assert df.prompt_messages[i] == [{"role": "user", "content": PROMPTS[r.prompt_index]}]
        assert df.prompt_tokens[i] == r.prompt_len and df.completion_tokens[i] == len(r.ids) - r.prompt_len
        assert df.sampled_tokens[i] == sum(r.loss_mask)
        sampled = [lp for lp, m in zip(r.logprobs, r.loss_mask) if m]
        assert math.isclose(df.logprob_sum[i], sum(sampled), rel_tol=1e-5)
    assert res.turns.groupby("row_id").size().tolist() == [4, 4, 4, 4]   # 2 assistant + 2 env turns each


@pytest.mark.timeout(180)
def test_tensors_mask_the_loss_to_the_sampled_tokens_and_a_pg_loss_is_the_single_turn_one(res: Episodes) -> None:
    scored = res.add_rewards({"right": lambda completion, answer: float(answer in completion)})
    t = scored.tensors()
    P = t["prompt_ids"].shape[1]
    for i, r in enumerate(res.records):
        k = len(r.ids) - r.prompt_len
        assert t["response_ids"][i, :k].tolist() == r.ids[r.prompt_len:]
        assert t["loss_mask"][i, :k].tolist() == [bool(m) for m in r.loss_mask[r.prompt_len:]]
        assert not t["loss_mask"][i, k:].any()
        assert t["turn_ids"][i, :k].tolist() == r.turn_ids[r.prompt_len:]
        roles = [ROLE_CODES["assistant"] if m else ROLE_CODES["env"] for m in r.loss_mask[r.prompt_len:]]
        assert t["roles"][i, :k].tolist() == roles and (t["roles"][i, k:] == ROLE_CODES["pad"]).all()
        assert t["input_ids"][i, P:P + k].tolist() == r.ids[r.prompt_len:]
    # An environment message sits between the turns: masked out of the loss and its advantage.
    env_tokens = t["response_mask"] & ~t["loss_mask"]
    assert env_tokens.sum(1).min() > 0
    assert (t["token_advantages"][env_tokens] == 0).all() and (t["logprobs"][env_tokens] == 0).all()
    lp = torch.where(t["loss_mask"], t["logprobs"], torch.zeros_like(t["logprobs"]))
    loss = -(t["token_advantages"] * lp).sum() / t["loss_mask"].sum()
    assert torch.isfinite(loss)


@pytest.mark.timeout(180)
def test_selection_concat_and_parquet_keep_episodes_whole(res: Episodes, tmp_path: Path) -> None:
    picked = res.where(res.df.prompt_index == 1)
    assert isinstance(picked, Episodes) and len(picked) == 2
    assert [r.ids for r in picked.records] == [r.ids for r in res.records[2:]]
    assert picked.turns.row_id.unique().tolist() == [2, 3]
    both = Episodes.concat([res, res], labels=["a", "b"])
    assert isinstance(both, Episodes) and len(both) == 8
    assert torch.equal(both.loss_mask[4:, :res.loss_mask.shape[1]], res.loss_mask)
    res.to_parquet(tmp_path / "ep.parquet")
    back = Episodes.from_parquet(tmp_path / "ep.parquet")
    assert isinstance(back, Episodes)
    for a, b in zip(res.records, back.records):
        assert (a.ids, a.loss_mask, a.turn_ids, a.roles, a.messages, a.turns, a.status) == \
               (b.ids, b.loss_mask, b.turn_ids, b.roles, b.messages, b.turns, b.status)
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-6)
    assert back.record == res.record and back.df.answer.tolist() == res.df.answer.tolist()
    # messages whose keys differ by role (a tool's "name") come back as they were, with no keys added
    tool_turn = [{"role": "assistant", "content": "<tool_call>...</tool_call>"},
                 {"role": "tool", "name": "add", "content": "5"}, {"role": "assistant", "content": "5"}]
    mixed = res.with_columns({"completion_messages": [tool_turn] * len(res)})
    mixed.to_parquet(tmp_path / "mixed.parquet")
    assert Episodes.from_parquet(tmp_path / "mixed.parquet").df.completion_messages.tolist() == [tool_turn] * len(res)


@pytest.mark.timeout(180)
def test_records_rebuild_the_same_episodes(res: Episodes) -> None:
    again = episodes_from_records(res.records, pad_token_id=res.pad_token_id)
    assert [r.ids for r in again.records] == [r.ids for r in res.records]
    # staleness is against the Engine's version when the call ended: records alone do not know it
    assert "staleness" not in again.df and set(res.df.staleness) == {0}
    assert again.df.drop(columns=["run", "prompt"]).equals(res.df.drop(columns=["run", "prompt", "staleness"]))


@pytest.mark.timeout(180)
def test_trl_reward_functions_get_each_episodes_messages_after_the_prompt(res: Episodes) -> None:
    seen: list[Any] = []

    def trl_turns(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        seen.extend(completions)
        return [float(sum(m["role"] == "assistant" for m in c)) for c in completions]

    out = res.add_rewards(trl_turns, mode="inline")
    assert seen == res.df.completion_messages.tolist()
    assert out.df.reward.tolist() == [2.0] * 4
    assert out.group_stats().n.tolist() == [2, 2]      # groups are prompts; rows are episodes


@pytest.mark.timeout(180)
def test_rescoring_an_episode_compares_its_sampled_tokens_only(engine: rlgen.Engine, res: Episodes) -> None:
    scored = engine.score(res)
    assert scored.response_ids.shape == res.response_ids.shape
    shift = rlgen.compare(res, scored)
    sampled = int(res.loss_mask.sum())
    mask = shift.tensors()["mask"]
    assert int(mask.sum()) == sampled < int(res.response_mask.sum())
    assert torch.equal(mask.bool(), res.loss_mask)
    # Sampled at temperature 1 on the same weights: the sampled tokens' logprobs are re-scored
    # alike, and the environment's tokens (logprob 0.0, never sampled) are not compared.
    verdict = engine.check_logprobs(res)
    assert verdict.aligned and verdict.n_tokens == sampled, verdict


@pytest.mark.timeout(180)
def test_check_drift_adds_one_cause_per_episode(res: Episodes) -> None:
    checked = res.check_drift()
    assert list(checked.df.columns[-3:]) == ["drift", "drift_turn", "drift_position"]
    summary = checked.drift_summary()
    assert int(summary.loc["all", "episodes"]) == 4
    for i, cause in enumerate(checked.df.drift):
        assert cause == res.drift(i).cause
        assert (cause == "same") == bool(checked.df.drift_position.isna()[i])


@pytest.mark.timeout(180)
def test_turn_rewards_score_each_assistant_turn_with_the_messages_before_it(res: Episodes) -> None:
    seen: list[tuple[Any, Any]] = []

    def trl_turn(prompts: list[Any], completions: list[Any], completion_ids: list[Any], **kw: Any) -> list[float]:
        seen.extend(zip(prompts, completions))
        return [float(len(ids)) for ids in completion_ids]

    out = res.add_turn_rewards(trl_turn, mode="inline")
    records = res.records
    assert out.df.turn_rewards.tolist() == [[float(t["tokens"]) for t in r.assistant_turns] for r in records]
    first_prompt, first_turn = seen[0]
    assert first_prompt == records[0].messages[:1]                   # the prompt, before turn 0
    assert seen[1][0] == records[0].messages[:3]                     # prompt, turn 0, the environment's reply
    assert first_turn == [{"role": "assistant", "content": records[0].assistant_turns[0]["text"]}]
    turns = out.turns
    assert turns[turns.role == "assistant"].reward.tolist() == [v for r in out.df.turn_rewards for v in r]
    assert turns[turns.role == "env"].reward.isna().all() and "reward" not in res.turns


def test_a_turn_is_kept_as_the_dict_of_its_role_with_the_turns_frame_columns_in_order() -> None:
    from rlgen.episodes import Turn
    from rlgen.episodes._result import TURN_COLUMNS

    common = TURN_COLUMNS[2:]  # turn ... latency_s
    assert list(Turn(0, "assistant").as_dict()) == [*common, "rid", "weight_version", "matched_stop",
                                                           "n_segments", "kv_staleness", "num_retractions"]
    said = Turn(1, "env", text="4", tokens=3, tool_calls=1, tool_calls_failed=0, status=None, done=False)
    assert list(said.as_dict()) == [*common, "status", "done", "calls", "roles", "reward", "info"]
    assert said.as_dict()["tokens"] == 3 and said.as_dict()["logprob_mean"] is None


def test_a_built_result_has_each_records_ids_logprobs_and_sums_exactly() -> None:
    import random

    from rlgen.episodes import EpisodeRecord
    from rlgen.episodes._result import Turn

    rng = random.Random(3)
    records = []
    for p in range(3):
        for s in range(2):
            r = EpisodeRecord(p, s, messages=[{"role": "user", "content": f"q{p}"}], n_prompt_messages=1)
            r.extend([rng.randrange(5, 900) for _ in range(4 + p)], role="prompt", turn=0)
            r.prompt_len = 4 + p
            for turn in range(1 + s):
                k = rng.randrange(1, 6)
                r.extend([rng.randrange(5, 900) for _ in range(k)], role="assistant", turn=turn, mask=1,
                         logprobs=[-rng.random() * 7 for _ in range(k)])
                r.extend([2, 9, 9], role="env", turn=turn)
                r.turns.append(Turn(turn, "assistant", text="a", tokens=k).as_dict())
            r.status = "done"
            records.append(r)
    records[-1].status, records[-1].ids[records[-1].prompt_len:] = "template_error", []  # nothing after its prompt
    for name in ("loss_mask", "logprobs", "turn_ids", "roles"):
        del getattr(records[-1], name)[records[-1].prompt_len:]
    res = episodes_from_records(records, pad_token_id=0)
    for i, r in enumerate(records):
        assert res.id_lists("prompt", rows=[i])[0] == r.ids[:r.prompt_len]
        assert res.id_lists("response", rows=[i])[0] == r.ids[r.prompt_len:]
        sampled = [lp for lp, m in zip(r.logprobs, r.loss_mask) if m]
        row = res.df.iloc[i]
        if sampled:
            assert row.logprob_sum == sum(sampled) and row.logprob_mean == sum(sampled) / len(sampled)
        else:
            assert math.isnan(row.logprob_sum) and math.isnan(row.logprob_mean)
        assert row.sampled_tokens == sum(r.loss_mask) and row.completion_tokens == len(r.ids) - r.prompt_len


def test_plain_turns_and_messages_are_kept_and_anything_else_is_stored_as_json_would() -> None:
    from rlgen.episodes._episodes import _json_safe

    plain = [{"role": "tool", "content": "4", "calls": [{"name": "add", "result": 4.0, "ok": True, "x": None}]}]
    assert _json_safe(plain) is plain  # not copied
    odd = {"t": (1, 2), 3: "int key", "obj": Exception("boom"), "nan": math.nan}
    safe = _json_safe(odd)
    assert safe["t"] == [1, 2] and safe["3"] == "int key" and safe["obj"] == "Exception('boom')" and math.isnan(safe["nan"])
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="Circular"):
        _json_safe(cyclic)


def test_an_episodes_turns_keep_the_assistant_turns_and_make_the_environments_replies_json_safe() -> None:
    from rlgen.episodes._episodes import _turns_safe

    plain = [{"role": "assistant", "text": "hi", "tokens": 2}, {"role": "env", "info": {"n": 1}, "calls": []}]
    assert _turns_safe(plain) is plain  # not copied
    odd = [plain[0], {"role": "env", "info": {"seen": (1, 2)}, "reward": Exception("r")}]
    safe = _turns_safe(odd)
    assert safe[0] is plain[0] and safe[1] == {"role": "env", "info": {"seen": [1, 2]}, "reward": "Exception('r')"}
    assert odd[1]["info"] == {"seen": (1, 2)}  # the runner's own records are left as they were


def test_a_record_refuses_logprobs_that_do_not_match_its_ids() -> None:
    from rlgen.episodes import EpisodeRecord

    r = EpisodeRecord(0, 0)
    with pytest.raises(ValueError, match="1 logprobs for 2 ids"):
        r.extend([5, 6], role="assistant", turn=0, mask=1, logprobs=[-0.1])
    assert r.ids == [] and r.loss_mask == []  # refused whole: nothing appended
