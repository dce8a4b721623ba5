"""LoRA adapters through an Engine on a real CPU-backend server: `Engine(lora=...)`, `load_adapter`
(a directory, a PEFT model in memory), `generate(adapter=)` per call and per prompt, rows and
records, `score` under each row's adapter, the completion cache, `rlgen.ab` across adapters, and
what is refused before anything is sent.

The proof that the server applies an adapter is against PEFT itself: the served logprobs of fixed
texts under an adapter equal the PEFT model's own forward (float32 on both sides)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import rlgen
from rlgen import AdapterError
from rlgen.client import _lora

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.slow

TEXTS = ["The capital of France is", "def add(a, b):", "List three fruits:"]
COMPLETIONS = [" Paris, a city on the Seine.", "\n    return a + b", " apples, pears and plums."]
CHATS = [[{"role": "user", "content": q}] for q in ("Name a colour.", "What is 2+3?", "Say hi.")]
SAME = 1e-3  # float32 server vs float32 PEFT forward; an adapter moves logprobs by tenths
LORA = {"max_rank": 8, "target_modules": ["q_proj", "v_proj"], "max_loras_per_batch": 4}


def lora_model(model_path: str, *, seed: int, r: int = 8, scale: float = 1.0) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model = peft.get_peft_model(base, peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"],
                                                      init_lora_weights=False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(scale)
    return model.eval()


def own_logprobs(model: Any, tok: Any) -> torch.Tensor:
    """The PEFT model's own logprob sums of COMPLETIONS after TEXTS, as eng.score computes them."""
    sums = []
    with torch.no_grad():
        for text, completion in zip(TEXTS, COMPLETIONS):
            p, c = tok(text)["input_ids"], tok(completion, add_special_tokens=False)["input_ids"]
            x = torch.tensor([p + c])
            logp = model(input_ids=x).logits[0, len(p) - 1:-1].log_softmax(-1)
            sums.append(logp.gather(-1, x[0, len(p):, None]).sum())
    return torch.stack(sums)


def served(eng: rlgen.Engine, **kw: Any) -> torch.Tensor:
    return torch.tensor(eng.score(TEXTS, COMPLETIONS, **kw).df["logprob_sum"].to_numpy())


@pytest.fixture(scope="module")
def eng(model_path: str) -> Iterator[rlgen.Engine]:
    with rlgen.Engine(model_path, backend="cpu", progress=False, fast_start=True, lora=LORA) as engine:
        yield engine


@pytest.fixture(scope="module")
def adapter(model_path: str) -> Any:
    return lora_model(model_path, seed=0, scale=0.5)


@pytest.mark.timeout(240)
def test_an_adapter_from_memory_serves_what_peft_computes_and_base_rows_stay_the_base(
        eng: rlgen.Engine, adapter: Any, tok: Any) -> None:
    loaded = eng.load_adapter("policy", adapter)
    assert loaded.source == "tensors" and loaded.rank == 8 and eng.adapters["policy"].sha256 == loaded.sha256
    with adapter.disable_adapter():
        base_own = own_logprobs(adapter, tok)
    assert (served(eng) - base_own).abs().max() < SAME
    under = served(eng, adapter="policy")
    assert (under - own_logprobs(adapter, tok)).abs().max() < SAME
    assert (under - base_own).abs().max() > 0.05  # the adapter changes what is served


@pytest.mark.timeout(240)
def test_a_directory_adapter_equals_the_same_adapter_from_memory(eng: rlgen.Engine, adapter: Any,
                                                                 tmp_path: Path) -> None:
    adapter.save_pretrained(tmp_path / "a")
    eng.load_adapter("policy", adapter)
    loaded = eng.load_adapter("from_dir", str(tmp_path / "a"))
    assert loaded.source == str((tmp_path / "a").resolve())
    assert (served(eng, adapter="from_dir") - served(eng, adapter="policy")).abs().max() < SAME


@pytest.mark.timeout(240)
def test_base_and_adapter_sample_in_one_call_and_each_row_records_and_rescores_under_its_own(
        eng: rlgen.Engine, adapter: Any) -> None:
    eng.load_adapter("policy", adapter)
    res = eng.generate(CHATS * 2, adapter=[None] * 3 + ["policy"] * 3, n=2, max_new_tokens=8, temperature=1.0, seed=1)
    assert res.df["adapter"][:6].isna().all() and list(res.df["adapter"][6:]) == ["policy"] * 6
    assert res.record["adapters"] == {"policy": eng.adapters["policy"].as_dict()}
    check = eng.check_logprobs(res)  # each row re-scored under the adapter it was sampled with
    assert check.aligned and check.weights_match, check
    base_rescored = eng.score(res, adapter=None)  # all rows under the base model: adapter rows move
    diff = (base_rescored.logprobs - res.logprobs).abs().sum(-1)
    assert diff[:6].max() < 1e-2 and diff[6:].min() > 1e-2
    alone = eng.generate(CHATS, n=2, max_new_tokens=8, temperature=1.0, seed=1)
    assert "adapter" in alone.df.columns and alone.df["adapter"].isna().all()  # a LoRA server: base rows say None


@pytest.mark.timeout(240)
def test_reloading_a_name_serves_the_new_adapter_and_the_cache_keys_on_its_content(
        eng: rlgen.Engine, model_path: str, adapter: Any, tok: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLGEN_CACHE_DIR", str(tmp_path))  # read at the Engine's first cached call: this one
    first = eng.load_adapter("policy", adapter)
    cached = eng.generate(CHATS, adapter="policy", max_new_tokens=6, temperature=0, cache=True)
    again = eng.generate(CHATS, adapter="policy", max_new_tokens=6, temperature=0, cache=True)
    assert again.df["cached"].all() and list(again.df["completion"]) == list(cached.df["completion"])
    stepped = lora_model(model_path, seed=1, scale=0.5)  # "after a training step": other tensors
    second = eng.load_adapter("policy", stepped)
    assert second.load > first.load and second.sha256 != first.sha256
    assert (served(eng, adapter="policy") - own_logprobs(stepped, tok)).abs().max() < SAME
    fresh = eng.generate(CHATS, adapter="policy", max_new_tokens=6, temperature=0, cache=True)
    assert not fresh.df["cached"].any()
    eng.load_adapter("policy", adapter)


@pytest.mark.timeout(240)
def test_an_adapters_load_counts_the_loads_of_its_own_name_only(eng: rlgen.Engine, adapter: Any) -> None:
    eng.load_adapter("policy", adapter)  # another name, loaded before
    assert eng.load_adapter("counted", adapter).load == 1
    assert eng.load_adapter("counted", adapter).load == 2
    eng.unload_adapter("counted")


@pytest.mark.timeout(240)
def test_ab_compares_base_and_adapter_on_the_same_prompts_without_reloading(eng: rlgen.Engine, adapter: Any) -> None:
    eng.load_adapter("policy", adapter)
    loads = eng.adapters["policy"].load
    base = eng.generate(CHATS, n=4, max_new_tokens=8, seed=3)
    tuned = eng.generate(CHATS, n=4, max_new_tokens=8, seed=3, adapter="policy")
    report = rlgen.ab(base, tuned, labels=("base", "policy"))
    assert "completion_tokens" in set(report.df["metric"]) and report.labels == ("base", "policy")
    assert eng.adapters["policy"].load == loads  # nothing was loaded again


@pytest.mark.timeout(240)
def test_ab_by_adapter_pairs_the_base_and_adapter_rows_of_one_call_by_prompt(eng: rlgen.Engine, adapter: Any) -> None:
    eng.load_adapter("policy", adapter)
    k = len(CHATS)
    both = eng.generate(CHATS + CHATS, n=2, max_new_tokens=8, seed=3, adapter=[None] * k + ["policy"] * k)
    report = rlgen.ab(both, by="adapter")
    assert report.labels == ("base", "policy") and set(report.df["prompts"]) == {k}
    assert report.notes[0].startswith(f"paired by prompt text, not prompt_index: A's prompt_index 0 is B's {k}")
    base, policy = both.where(both.df.adapter.isna()), both.where(both.df.adapter == "policy")
    assert report.df.equals(rlgen.ab(base, policy, labels=("base", "policy")).df)


@pytest.mark.timeout(240)
def test_what_the_server_cannot_take_is_refused_before_anything_is_sent(eng: rlgen.Engine, model_path: str,
                                                                        tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match=r"lora=\{'max_rank': 16\}"):
        eng.load_adapter("big", lora_model(model_path, seed=0, r=16))
    with pytest.raises(AdapterError, match="did you mean 'policy'"):
        eng.generate(CHATS, adapter="polcy")
    with pytest.raises(ValueError, match="one per prompt"):
        eng.generate(CHATS, adapter=["policy"])
    with pytest.raises(AdapterError, match=r"no adapter_config\.json"):
        eng.load_adapter("x", str(tmp_path))
    with pytest.raises(TypeError, match="PEFT adapter directory or a PEFT model"):
        eng.load_adapter("x", {"a": 1})


@pytest.mark.timeout(240)
def test_an_unloaded_adapter_is_gone_from_the_engine_and_the_server(eng: rlgen.Engine, adapter: Any) -> None:
    eng.load_adapter("temp", adapter)
    eng.unload_adapter("temp")
    assert "temp" not in eng.adapters
    with pytest.raises(AdapterError, match="no adapter 'temp'"):
        eng.generate(CHATS, adapter="temp")
    # the server's own refusal of the name, sent anyway (as a user's raw request would be): SGLang
    # keeps every name it loaded and reloads it from its path; a tensor adapter has none
    # (tokenizer_manager._resolve_lora_path), so the server answers 400 too
    body = {"input_ids": [[1, 2, 3]], "lora_path": ["temp"], "sampling_params": {"max_new_tokens": 1}}
    request = urllib.request.Request(f"{eng.url}/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=30)
    assert raised.value.code == 400 and "Failed to implicitly load LoRA adapter temp" in raised.value.read().decode()


@pytest.mark.timeout(120)
def test_a_server_without_lora_says_how_to_start_one(model_path: str) -> None:
    with rlgen.Engine(model_path, backend="cpu", progress=False, fast_start=True) as plain:
        assert not plain.serves_lora and plain.adapters == {}
        with pytest.raises(AdapterError, match="lora=True"):
            plain.generate(CHATS, adapter="policy")
        with pytest.raises(AdapterError, match="lora=True"):
            plain.load_adapter("policy", "/nowhere")
        assert "adapter" not in plain.generate(CHATS, max_new_tokens=2).df.columns


@pytest.mark.timeout(240)
def test_an_adapter_loaded_at_start_whose_files_are_not_here_is_never_answered_from_the_base_models_cache(
        model_path: str, adapter: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server read the adapter's files at start; this process cannot (another machine's path):
    its content is unknown here, so the completion cache refuses its prompts (an AdapterError that
    says what to do) rather than keying them as the base model's and serving the base's samples."""
    directory = tmp_path / "far"
    adapter.save_pretrained(str(directory))
    monkeypatch.setenv("RLGEN_CACHE_DIR", str(tmp_path / "cache"))

    def unreadable(path: Any) -> Any:
        raise OSError(f"{path}: not on this machine")

    monkeypatch.setattr(_lora, "from_directory", unreadable)  # this process only, not the server
    with rlgen.Engine(model_path, backend="cpu", progress=False, fast_start=True,
                      lora={**LORA, "adapters": {"far": str(directory)}}) as eng:
        assert eng.adapters["far"].sha256 is None and eng.adapters["far"].rank is None
        base = eng.generate(CHATS, max_new_tokens=6, temperature=0, cache=True)
        assert list(eng.generate(CHATS, max_new_tokens=6, temperature=0, cache=True).df["cached"]) == [True] * 3
        with pytest.raises(AdapterError, match=r"'far'.*unread here.*load_adapter\(\), or pass cache=False"):
            eng.generate(CHATS, adapter="far", max_new_tokens=6, temperature=0, cache=True)
        with pytest.raises(AdapterError, match="cache=False"):  # also for one prompt of a mixed call
            eng.generate(CHATS, adapter=[None, "far", None], max_new_tokens=6, temperature=0, cache=True)
        sampled = eng.generate(CHATS, adapter="far", max_new_tokens=6, temperature=0)  # usable without the cache
        assert list(sampled.df["adapter"]) == ["far"] * 3 and "cached" not in sampled.df.columns
        assert len(base) == 3
