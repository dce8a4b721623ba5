"""The completion cache (`cache=`): keys, validated entries (corrupt, partial and foreign files are
never returned), the weights' content hash, and an Engine on a real CPU-backend server whose hits
make no request (the server is frozen while they are answered)."""

from __future__ import annotations

import os
import shutil
import signal
import warnings
from pathlib import Path

import pytest

import rlgen
from rlgen.client._completion_cache import CompletionCache, cache_key, merge, split, store_finished
from rlgen.server._weights import weights_sha256

KEY_ARGS = {"weights_sha256": "ab" * 32, "weight_version": "default", "prompt_ids": [1, 2, 3],
            "sampling": {"temperature": 0.0, "max_new_tokens": 8}, "n": 2, "logprobs": True, "top_logprobs": 0}
ANSWERS = [{"text": "a", "output_ids": [5], "meta_info": {"finish_reason": {"type": "stop"}}},
           {"text": "b", "output_ids": [6], "meta_info": {"finish_reason": {"type": "length"}}}]


def test_a_key_is_the_same_for_equal_inputs_and_changes_with_every_input() -> None:
    key = cache_key(**KEY_ARGS)
    assert key == cache_key(**{**KEY_ARGS, "sampling": {"max_new_tokens": 8, "temperature": 0.0}})
    changes = {"weights_sha256": "cd" * 32, "weight_version": "v2", "prompt_ids": [1, 2, 4],
               "sampling": {"temperature": 0.0, "max_new_tokens": 9}, "n": 3, "logprobs": False, "top_logprobs": 2}
    keys = {name: cache_key(**{**KEY_ARGS, name: value}) for name, value in changes.items()}
    assert key not in keys.values() and len(set(keys.values())) == len(changes)
    seeded = cache_key(**{**KEY_ARGS, "sampling": {**KEY_ARGS["sampling"], "sampling_seed": 1}})
    assert seeded != cache_key(**{**KEY_ARGS, "sampling": {**KEY_ARGS["sampling"], "sampling_seed": 2}})


def test_an_entry_reads_back_and_a_missing_one_is_none(tmp_path: Path) -> None:
    cache = CompletionCache(tmp_path)
    key = cache_key(**KEY_ARGS)
    assert cache.get(key, n=2) is None
    cache.put(key, ANSWERS)
    assert cache.get(key, n=2) == ANSWERS
    assert not list(tmp_path.rglob("*.tmp")) and cache.rejected == 0


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "empty", "no header", "other key", "other n",
                                    "garbage"])
def test_a_corrupt_partial_or_foreign_entry_is_never_returned_and_is_removed(tmp_path: Path, damage: str) -> None:
    cache = CompletionCache(tmp_path)
    key, other = cache_key(**KEY_ARGS), cache_key(**{**KEY_ARGS, "n": 3})
    cache.put(key, ANSWERS)
    path = cache.path(key)
    raw = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(raw[: len(raw) - 7])
    elif damage == "flipped byte":
        i = raw.index(b'"a"') + 1
        path.write_bytes(raw[:i] + b"z" + raw[i + 1:])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "no header":
        path.write_bytes(raw.partition(b"\n")[2])
    elif damage == "other key":  # another key's valid entry, copied under this key's name
        cache.put(other, ANSWERS + ANSWERS[:1])
        shutil.copy(cache.path(other), path)
    elif damage == "other n":
        assert cache.get(key, n=3) is None
        assert cache.rejected == 1 and not path.exists()
        return
    else:
        path.write_bytes(os.urandom(200))
    assert cache.get(key, n=2) is None
    assert cache.rejected == 1 and not path.exists()


def make_checkout(root: Path, weights: bytes = b"\x00" * 1000) -> Path:
    root.mkdir()
    (root / "model.safetensors").write_bytes(weights)
    (root / "config.json").write_text('{"model_type": "llama"}')
    (root / "tokenizer.json").write_text("{}")
    return root


def test_a_call_splits_into_hits_and_prompts_to_send_and_merges_back_in_prompt_order(tmp_path: Path) -> None:
    cache = CompletionCache(tmp_path)
    keys = [cache_key(**{**KEY_ARGS, "prompt_ids": [i]}) for i in range(4)]
    cache.put(keys[1], ANSWERS)
    hits, sent = split(cache, keys, n=2)
    assert list(hits) == [1] and sent == [0, 2, 3]
    aborted = {"text": "x", "output_ids": [7], "meta_info": {"finish_reason": {"type": "abort"}}}
    answers = [ANSWERS[0], ANSWERS[1], ANSWERS[0], aborted, ANSWERS[1], None]  # prompts 0, 2, 3 as sent
    store_finished(cache, keys, sent, answers, n=2)
    assert cache.get(keys[0], n=2) == ANSWERS                          # both samples finished: stored
    assert cache.get(keys[2], n=2) is None and cache.get(keys[3], n=2) is None  # one aborted / missing: not
    merged = merge(hits, sent, answers, prompts=4, n=2)
    assert merged[:4] == [ANSWERS[0], ANSWERS[1], *ANSWERS] and merged[4:7] == [ANSWERS[0], aborted, ANSWERS[1]]
    assert merged[7]["meta_info"]["finish_reason"] == {"type": "abort", "message": "aborted before the server answered"}
    short = merge({}, [0, 1], [ANSWERS[0]], prompts=2, n=2)  # an interrupted call: what never came is aborted
    assert short[0] == ANSWERS[0] and all(a["meta_info"]["finish_reason"]["type"] == "abort" for a in short[1:])


def test_the_weights_hash_follows_the_weights_bytes_not_timestamps_or_tokenizer_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLGEN_CACHE_DIR", str(tmp_path / "cache"))
    a = make_checkout(tmp_path / "a")
    digest = weights_sha256(a)
    assert digest is not None and len(digest) == 64
    assert weights_sha256(make_checkout(tmp_path / "b")) == digest  # same bytes elsewhere
    os.utime(a / "model.safetensors", ns=(1, 1))
    (a / "tokenizer.json").write_text('{"changed": true}')
    assert weights_sha256(a) == digest
    (a / "model.safetensors").write_bytes(b"\x00" * 999 + b"\x01")
    assert weights_sha256(a) != digest
    (a / "model.safetensors").write_bytes(b"\x00" * 1000)
    (a / "config.json").write_text('{"model_type": "mistral"}')
    assert weights_sha256(a) != digest
    assert weights_sha256(tmp_path / "missing") is None
    (tmp_path / "empty").mkdir()
    assert weights_sha256(tmp_path / "empty") is None


# -- an Engine on a real server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(model_path: str, tmp_path_factory: pytest.TempPathFactory):
    cache_root = tmp_path_factory.mktemp("rlgen-cache")
    old = os.environ.get("RLGEN_CACHE_DIR")
    os.environ["RLGEN_CACHE_DIR"] = str(cache_root)
    try:
        with rlgen.Engine(model_path, backend="cpu", progress=False, cache=True) as eng:
            yield eng
    finally:
        if old is None:
            os.environ.pop("RLGEN_CACHE_DIR", None)
        else:
            os.environ["RLGEN_CACHE_DIR"] = old


PROMPTS = ["What is 2+2?", "Name a colour.", "Say hi."]


@pytest.mark.timeout(240)
def test_a_repeated_greedy_call_is_answered_from_the_cache_without_a_request(engine: rlgen.Engine) -> None:
    first = engine.generate(PROMPTS[:2], n=2, max_new_tokens=6, temperature=0)
    assert not first.df.cached.any() and first.record["cache"] == {"hits": 0, "sent": 2}
    pid = engine.info["pid"]
    os.kill(pid, signal.SIGSTOP)  # a frozen server: any request would hang
    try:
        again = engine.generate(PROMPTS[:2], n=2, max_new_tokens=6, temperature=0, chunk_size=1)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert again.df.cached.all() and again.record["cache"] == {"hits": 2, "sent": 0}
    assert again.df.completion.tolist() == first.df.completion.tolist()
    assert again.id_lists("response") == first.id_lists("response")
    assert (again.logprobs == first.logprobs).all()
    # A call with one new prompt sends only that one; the others come back cached, in order.
    mixed = engine.generate(PROMPTS, n=2, max_new_tokens=6, temperature=0)
    assert mixed.df.cached.tolist() == [True, True, True, True, False, False]
    assert mixed.df.completion.tolist()[:4] == first.df.completion.tolist()
    assert mixed.record["cache"] == {"hits": 2, "sent": 1}
    # Other sampling parameters or cache=False miss.
    assert not engine.generate(PROMPTS[:1], n=2, max_new_tokens=7, temperature=0).df.cached.any()
    assert "cached" not in engine.generate(PROMPTS[:1], n=2, max_new_tokens=6, temperature=0, cache=False).df.columns


@pytest.mark.timeout(240)
def test_a_damaged_entry_is_ignored_and_the_prompt_goes_to_the_server(engine: rlgen.Engine) -> None:
    first = engine.generate(["Count to three."], max_new_tokens=6, temperature=0)
    root = Path(os.environ["RLGEN_CACHE_DIR"]) / "completions"
    newest = max(root.rglob("*"), key=lambda p: p.stat().st_mtime_ns if p.is_file() else 0)
    newest.write_bytes(newest.read_bytes()[:-5])  # a partial write
    again = engine.generate(["Count to three."], max_new_tokens=6, temperature=0)
    assert not again.df.cached.any() and again.df.completion.tolist() == first.df.completion.tolist()
    assert engine.generate(["Count to three."], max_new_tokens=6, temperature=0).df.cached.all()  # stored anew


@pytest.mark.timeout(240)
def test_unseeded_sampling_is_cached_only_when_asked_for(engine: rlgen.Engine) -> None:
    with pytest.warns(UserWarning, match="unseeded sampling"):
        engine.generate(["Tell me a word."], n=2, max_new_tokens=5, temperature=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per Engine
        unseeded = engine.generate(["Tell me a word."], n=2, max_new_tokens=5, temperature=1.0)
    assert "cached" not in unseeded.df.columns
    seeded = [engine.generate(["Tell me a word."], n=2, max_new_tokens=5, temperature=1.0, seed=7) for _ in range(2)]
    assert seeded[1].df.cached.all() and seeded[1].df.completion.tolist() == seeded[0].df.completion.tolist()
    always = [engine.generate(["Tell me a word."], n=2, max_new_tokens=5, temperature=1.0, cache="always")
              for _ in range(2)]
    assert always[1].df.cached.all() and always[1].df.completion.tolist() == always[0].df.completion.tolist()
    with pytest.raises(ValueError, match="'always'"):
        engine.generate(["x"], cache="sometimes")  # type: ignore[typeddict-item]


@pytest.mark.timeout(240)
def test_every_result_carries_its_record_through_selection_concat_and_parquet(engine: rlgen.Engine,
                                                                               tmp_path: Path) -> None:
    res = engine.generate(PROMPTS[:2], n=2, max_new_tokens=4, temperature=0, seed=3)
    record = res.record
    assert record is not None
    assert record["weights_sha256"] == weights_sha256(engine.model_path) and record["backend"] == "cpu"
    assert record["model_path"] == engine.model_path and record["weight_versions"] == ["default"]
    assert record["sampling"]["n"] == 2 and record["seed"] == 3 and record["rlgen_version"] == rlgen.__version__
    assert record["server_version"] and record["started_utc"].endswith("+00:00")
    assert "--model-path" in record["server_args"]
    assert res[1:3].record == record and res.where(res.df.sample_index == 0).record == record
    res.to_parquet(tmp_path / "r.parquet")
    assert rlgen.Rollouts.from_parquet(tmp_path / "r.parquet").record == record
    both = rlgen.Rollouts.concat([res, res], labels=["a", "b"])
    assert both.run_records == {"a": record, "b": record}
    with pytest.raises(ValueError, match="run_records"):
        _ = both.record


@pytest.mark.timeout(240)
def test_the_view_says_what_made_the_rows_and_holds_the_whole_record(engine: rlgen.Engine) -> None:
    res = engine.generate(PROMPTS[:1], max_new_tokens=4, temperature=0, seed=5)
    page = res._repr_html_()
    assert f"weights sha256 {res.record['weights_sha256'][:12]}" in page
    assert "weight version default" in page and "seed 5" in page and "cpu server 0.5.17+rlgen.cpu" in page
    assert "completion cache" in page and "<summary" in page and res.record["started_utc"][:10] in page
