"""Weights from the notebook, no disk: `Engine.update_weights` on a real CPU-backend server.

The notebook holds the model with transformers (bf16, as the checkpoint); the server gets its
tensors by value through SGLang's `/update_weights_from_tensor` request. After a push the server's
logprobs of fixed texts equal those of a fresh server started on the same weights saved to disk;
a perturbed push changes them and pushing the originals back restores them; small buckets make
several requests with the same result; rows record the version; it works inside and after
`paused()`; and what cannot work is refused before anything is sent, with what to do instead.
"""

from __future__ import annotations

import copy
import html
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import rlgen
from rlgen import EngineError, ServerRequestError, WeightsError
from rlgen.client._tensors import Transport, bucket_body

pytestmark = pytest.mark.slow

TEXTS = ["The capital of France is", "def add(a, b):", "List three fruits:", "Rain falls on"]
COMPLETIONS = [" Paris, a city on the Seine.", "\n    return a + b", " apples, pears and plums.", " the quiet town."]
# float32 logprobs of the same texts move by ~1e-5 between calls (batching and the prefix cache:
# measured in `base`); a real change of weights moves them by tenths.
SAME = 1e-4
CHATS = [[{"role": "user", "content": text}] for text in TEXTS]


def _score(eng: rlgen.Engine) -> torch.Tensor:
    return eng.score(TEXTS, COMPLETIONS).logprobs


@pytest.fixture(scope="module")
def eng(model_path: str) -> Iterator[rlgen.Engine]:
    with rlgen.Engine(model_path, backend="cpu", progress=False, fast_start=True, enable_memory_saver=True) as engine:
        yield engine


@pytest.fixture(scope="module")
def trainer(model_path: str) -> Any:
    """The notebook's model: the served checkpoint loaded with transformers, in its own dtype."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def perturbed(trainer: Any) -> Any:
    """A copy of the trainer with noise on every weight matrix (a training step, much exaggerated)."""
    model = copy.deepcopy(trainer)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.add_((torch.randn(p.shape, generator=gen) * p.float().std() * 0.2).to(p.dtype))
    return model


@pytest.fixture(scope="module")
def base(eng: rlgen.Engine) -> torch.Tensor:
    """The original weights' logprobs, and a check that the run-to-run noise is below SAME."""
    first, second = _score(eng), _score(eng)
    assert (first - second).abs().max() < SAME / 5
    return first


@pytest.fixture
def original(eng: rlgen.Engine, model_path: str, base: torch.Tensor) -> Iterator[None]:
    """Each test starts and ends on the checkpoint's weights."""
    yield
    eng.update_weights_from_disk(model_path, weight_version="original")


def _noisy_norms(trainer: Any) -> dict[str, torch.Tensor]:
    """A small push: every norm weight with noise (61 tensors, 70 KB)."""
    gen = torch.Generator().manual_seed(1)
    return {n: (t.float() * (1 + 0.3 * torch.randn(t.shape, generator=gen))).to(t.dtype)
            for n, t in trainer.state_dict().items() if "norm" in n}


class Spy:
    """Wraps the Engine's client: the /update_weights_from_tensor bodies sent (without their
    payloads), and failures to answer instead of the server's."""

    def __init__(self, eng: rlgen.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.fail: dict[int, Exception] = {}   # request index -> what to raise instead of sending it
        post = eng._client.post

        async def spy(path: str, body: Any = None, **kwargs: Any) -> Any:
            if path == "/update_weights_from_tensor":
                index = len(self.bodies)
                self.bodies.append({k: v for k, v in body.items() if k != "serialized_named_tensors"}
                                   | {"ranks": len(body["serialized_named_tensors"])})
                if index in self.fail:
                    raise self.fail.pop(index)
            return await post(path, body, **kwargs)

        monkeypatch.setattr(eng._client, "post", spy)


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("original")
def test_a_push_serves_what_a_fresh_server_loads_from_the_same_weights_on_disk(
        eng: rlgen.Engine, trainer: Any, perturbed: Any, base: torch.Tensor, model_path: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    version = eng.update_weights(perturbed, weight_version="step-1")
    assert version == "step-1"
    res = eng.score(TEXTS, COMPLETIONS)
    pushed = res.logprobs
    assert (pushed - base).abs().max() > 0.1, "the perturbed weights changed nothing"
    assert set(res.df.weight_version) == {"step-1"}
    greedy = eng.generate(CHATS, max_new_tokens=4, temperature=0.0)
    assert set(greedy.df.weight_version) == {"step-1"} and greedy.record["weight_versions"] == ["step-1"]
    # The weights are on no disk: the record says so, and the completion cache (keyed by their
    # content hash) refuses rather than serve another model's completions.
    assert greedy.record["weights_path"] is None and greedy.record["weights_sha256"] is None
    assert "weights pushed from the notebook's tensors" in html.unescape(greedy._repr_html_())  # the view's record line
    with pytest.raises(EngineError, match=r"pushed with update_weights\(\) have none: pass cache=False"):
        eng.generate(CHATS, max_new_tokens=4, temperature=0.0, cache=True)

    saved = tmp_path / "step-1"
    perturbed.save_pretrained(saved)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(saved)
    with rlgen.Engine(str(saved), backend="cpu", progress=False, fast_start=True) as fresh:
        from_disk = _score(fresh)
    assert (pushed - from_disk).abs().max() < SAME

    assert eng.update_weights(trainer) == f"tensors@{eng._weights.updates}"   # the default: this Engine's nth update
    assert (_score(eng) - base).abs().max() < SAME


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("original")
def test_small_buckets_make_several_requests_the_last_flushing_and_versioning_with_the_same_result(
        eng: rlgen.Engine, trainer: Any, base: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    noisy = _noisy_norms(trainer)
    spy = Spy(eng, monkeypatch)
    greedy = {"max_new_tokens": 8, "temperature": 0.0, "logprobs": False}   # (prompt logprobs skip the prefix cache)
    eng.generate(CHATS, **greedy)
    before = eng.generate(CHATS, **greedy).df.cached_tokens
    assert (before > 0).all()   # the prefix cache holds the old weights' keys
    eng.update_weights(noisy, weight_version="norms-1")
    after = eng.generate(CHATS, **greedy).df.cached_tokens
    # ... and the push flushed it: the first prompts admitted find nothing cached, not even the chat
    # template all four share. Under load the four need not be admitted as one batch (a run saw
    # [0, 24, 24, 24]): a later one finds that template, computed since the push, never its old prefix.
    assert after.min() == 0 and (after < before).all(), (before.tolist(), after.tolist())
    one_request = _score(eng)
    assert (one_request - base).abs().max() > 0.1
    assert spy.bodies == [{"load_format": None, "flush_cache": True, "weight_version": "norms-1", "ranks": 1}]

    originals = {n: t for n, t in trainer.state_dict().items() if n in noisy}
    eng.update_weights(originals)
    assert (_score(eng) - base).abs().max() < SAME   # pushing the originals back restores them

    for flatten in (False, True):
        spy.bodies.clear()
        assert eng.update_weights(noisy, weight_version=f"small-{flatten}", bucket_mb=0.005, flatten=flatten) == \
            f"small-{flatten}"
        assert len(spy.bodies) >= 10   # 61 tensors of 1,152 bytes, ~4 per 5 KiB bucket
        assert [b["flush_cache"] for b in spy.bodies] == [False] * (len(spy.bodies) - 1) + [True]
        assert [b["weight_version"] for b in spy.bodies] == [None] * (len(spy.bodies) - 1) + [f"small-{flatten}"]
        assert {b["load_format"] for b in spy.bodies} == {"flattened_bucket" if flatten else None}
        res = eng.score(TEXTS, COMPLETIONS)
        assert (res.logprobs - one_request).abs().max() < SAME
        assert set(res.df.weight_version) == {f"small-{flatten}"}


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("original")
def test_inside_paused_a_full_push_replaces_the_reload_and_a_partial_push_lands_on_the_old_weights(
        eng: rlgen.Engine, trainer: Any, perturbed: Any, base: torch.Tensor, model_path: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    eng.update_weights(perturbed)
    expected = _score(eng)
    eng.update_weights_from_disk(model_path, weight_version="original")

    reloads: list[Any] = []
    control = eng._control.post
    monkeypatch.setattr(eng._control, "post",
                        lambda path, body, **kw: (reloads.append((path, body)), control(path, body, **kw))[1])
    spy = Spy(eng, monkeypatch)
    with eng.paused():
        assert eng._control.released == {"weights", "kv_cache", "cuda_graph"}
        eng.update_weights(perturbed, weight_version="paused-full")
        assert eng._control.released == {"kv_cache", "cuda_graph"}   # the weights' memory is back, the rest not yet
    assert [path for path, _ in reloads] == ["/release_memory_occupation", "/resume_memory_occupation",
                                             "/resume_memory_occupation"]   # every tensor came: nothing from disk
    # Resumed by name, the weights first and the rest at the end (SGLang's scheduler fails on a tag
    # that is not released); the KV cache, released and so flushed, is not flushed again.
    assert [body for _, body in reloads[1:]] == [{"tags": ["weights"]}, {"tags": ["cuda_graph", "kv_cache"]}]
    # by value the default bucket is 64 MiB: the 257 MiB of bf16 weights go as 5 requests
    assert len(spy.bodies) == 5 and {b["flush_cache"] for b in spy.bodies} == {False}
    res = eng.score(TEXTS, COMPLETIONS)
    assert (res.logprobs - expected).abs().max() < SAME and set(res.df.weight_version) == {"paused-full"}

    # A push that leaves tensors out lands on the old weights, reloaded first (resumed weights are zeros).
    noisy = _noisy_norms(trainer)
    eng.update_weights_from_disk(model_path, weight_version="original")
    eng.update_weights(noisy)
    norms_only = _score(eng)
    eng.update_weights_from_disk(model_path, weight_version="original")
    reloads.clear()
    with eng.paused():
        eng.update_weights(noisy, weight_version="paused-norms")
    assert [path for path, _ in reloads].count("/update_weights_from_disk") == 1
    assert (_score(eng) - norms_only).abs().max() < SAME

    # After the block: the weights were reloaded on resume, and a push goes on top as usual.
    with eng.paused():
        pass
    eng.update_weights(noisy, weight_version="after-paused")
    res = eng.score(TEXTS, COMPLETIONS)
    assert (res.logprobs - norms_only).abs().max() < SAME and set(res.df.weight_version) == {"after-paused"}

    # Pushed weights are on no disk: a pause without a push brings back the checkpoint under its own
    # version (rows never claim the pushed version for other weights).
    with eng.paused():
        pass
    res = eng.score(TEXTS, COMPLETIONS)
    assert (res.logprobs - base).abs().max() < SAME and set(res.df.weight_version) == {"original"}
    assert eng.generate(CHATS[:1], max_new_tokens=2).record["weights_path"] == model_path


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("original")
def test_what_cannot_work_is_refused_before_anything_is_sent(
        eng: rlgen.Engine, trainer: Any, base: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = Spy(eng, monkeypatch)
    with pytest.raises(WeightsError, match=r"'model.norm.weigth' \(did you mean 'model.norm.weight'\?\)"):
        eng.update_weights({"model.norm.weigth": torch.ones(576)})
    with pytest.raises(WeightsError, match=r"'model.norm.weight' is \[577\], the server's is \[576\]"):
        eng.update_weights({"model.norm.weight": torch.ones(577)})
    with pytest.raises(WeightsError, match="meta device"):
        eng.update_weights({"model.norm.weight": torch.ones(576, device="meta")})
    with pytest.raises(WeightsError, match=r"LoRA tensors not merged.*merge_adapter"):
        eng.update_weights({"base_model.model.model.norm.weight": torch.ones(576),
                            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight": torch.ones(8, 576)})
    with pytest.raises(ValueError, match="bucket_mb"):
        eng.update_weights(trainer, bucket_mb=0)
    # What SGLang needs: a server on this machine, reading the tensors from its GPU (CUDA IPC).
    sglang_info = {k: v for k, v in eng._conn.server_info.items() if k != "rlgen_backend"}
    monkeypatch.setattr(eng._conn, "server_info", sglang_info)
    with pytest.raises(WeightsError, match=r"are on cpu .*move the model to the server's GPU.*update_weights_from_disk"):
        eng.update_weights(trainer)
    monkeypatch.setattr(eng._conn, "server_info", {**sglang_info, "dp_size": 2})  # SGLang refuses tensors there
    with pytest.raises(WeightsError, match=r"dp_size 1 \(or DP attention\).*update_weights_from_disk"):
        eng.update_weights(trainer)
    monkeypatch.setattr(eng._conn, "server_info", {**sglang_info, "dp_size": 2, "enable_dp_attention": True})
    with pytest.raises(WeightsError, match=r"are on cpu"):  # allowed with DP attention: on to the device check
        eng.update_weights(trainer)
    monkeypatch.setattr(eng._conn, "server_info", sglang_info)
    monkeypatch.setattr(eng, "url", "http://192.0.2.1:30000")   # TEST-NET-1: never this machine
    with pytest.raises(WeightsError, match=r"on another machine.*update_weights_from_disk\(path\)"):
        eng.update_weights(trainer)
    monkeypatch.setattr(eng._conn, "behind_router", True)
    with pytest.raises(WeightsError, match="router"):
        eng.update_weights(trainer)
    assert spy.bodies == []
    monkeypatch.undo()
    assert (_score(eng) - base).abs().max() < SAME


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("original")
def test_retries_and_a_failure_part_way_say_what_the_server_now_holds(
        eng: rlgen.Engine, trainer: Any, base: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    noisy = _noisy_norms(trainer)
    spy = Spy(eng, monkeypatch)
    spy.fail[0] = ServerRequestError("busy", status=503)   # transient: sent again
    eng.update_weights(noisy, backoff_s=0.01)
    assert len(spy.bodies) == 2 and (_score(eng) - base).abs().max() > 0.1

    eng.update_weights_from_disk(eng.model_path, weight_version="original")
    spy.bodies.clear()
    spy.fail[1] = ServerRequestError("refused", status=400)   # the second of several requests
    with pytest.raises(ServerRequestError, match=r"failed at request 2 of \d+ .*1 of them were loaded, so the server "
                                                 r"now serves a mix"):
        eng.update_weights(noisy, bucket_mb=0.02)
    assert (_score(eng) - base).abs().max() > 1e-3
    assert eng.generate(CHATS[:1], max_new_tokens=2).record["weights_path"] is None
    spy.bodies.clear()
    spy.fail[0] = ServerRequestError("refused", status=400)
    with pytest.raises(ServerRequestError, match="nothing was loaded, the server's weights are unchanged"):
        eng.update_weights(noisy)
    assert len(spy.bodies) == 1   # a 4xx is not retried


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("original")
def test_the_cpu_backend_answers_the_endpoint_like_sglang(eng: rlgen.Engine, base: torch.Tensor) -> None:
    def body(named: list[tuple[str, torch.Tensor]], **kw: Any) -> dict[str, Any]:
        return bucket_body(named, transport=Transport.VALUE, flatten=False, tp_size=1, flush_cache=True,
                           weight_version=None) | kw

    # SGLang's llama loader logs an unknown name and carries on: success, nothing changed.
    status, answer = _post(eng.url + "/update_weights_from_tensor", body([("model.not_a_weight", torch.ones(3))]))
    assert (status, answer) == (200, {"success": True, "message": "Success"})
    assert "Parameter model.not_a_weight not found in params_dict" in Path(eng._server.log_path).read_text()
    status, answer = _post(eng.url + "/update_weights_from_tensor",
                           body([("model.norm.weight", torch.ones(576))], weight_version="ones"))
    assert (status, answer) == (200, {"success": True, "message": "Success Weight version updated to ones."})
    assert eng.score(TEXTS[:1], COMPLETIONS[:1]).df.weight_version.tolist() == ["ones"]
    # Where SGLang's scheduler would die (a shape mismatch, an undecodable payload), 400 instead.
    status, answer = _post(eng.url + "/update_weights_from_tensor", body([("model.norm.weight", torch.ones(5))]))
    assert status == 400 and answer["success"] is False and "shape mismatch for model.norm.weight" in answer["message"]
    status, answer = _post(eng.url + "/update_weights_from_tensor", {"serialized_named_tensors": ["AAAA"]})
    assert status == 400 and "cannot deserialize" in answer["message"]
    status, answer = _post(eng.url + "/update_weights_from_tensor", {"load_format": None})
    assert status == 400 and "serialized_named_tensors" in answer["message"]
    # Released weights take no tensors (on SGLang they would be written to unmapped memory).
    eng.release_memory(["weights"])
    status, answer = _post(eng.url + "/update_weights_from_tensor", body([("model.norm.weight", torch.ones(576))]))
    assert status == 400 and "resume_memory_occupation first" in answer["message"]
    eng.resume_memory(["weights"])
