"""The CPU backend serves LoRA adapters as SGLang 0.5.17 does (issue 26 section 2): its flags, its
three endpoints and their answers, `lora_path` on /generate, and outputs equal to PEFT's own.

Two PEFT adapters are built on the test model: A (r=8, alpha=16, q_proj and v_proj) and B (r=4,
alpha=8, k_proj and v_proj, rslora), both with init_lora_weights=False so that B is not zero. One
server with LoRA (A at start through --lora-paths, --max-loras-per-batch 2) serves most tests;
state they change is named so that tests do not depend on their order.
"""

from __future__ import annotations

import base64
import hashlib
import json
import pickle
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _cpu_server_process import Server, free_port, generated, post, running_server

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

PROMPTS = [
    "The quick brown fox jumps over the lazy dog",
    "Once upon a time, in a land far away,",
    "1, 2, 3, 4, 5,",
    "A short one",
]
NOT_ENABLED = ("LoRA adapter '{}' was requested, but LoRA is not enabled. Please launch the server with --enable-lora "
               "flag and preload adapters using --lora-paths or /load_lora_adapter endpoint.")  # fmt: skip
TOLERANCE = 1e-3


# ---- adapters and PEFT's own logprobs --------------------------------------------------------------------


def _logprobs(model: Any, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1, from a forward pass in float32."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


@pytest.fixture(scope="module")
def adapters(model_path: str, tok: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Adapter directories A and B, and PEFT's logprobs of every prompt under A, B and the base."""
    from transformers import AutoModelForCausalLM

    from rlgen.cpu_server._model import default_num_threads

    threads = torch.get_num_threads()
    torch.set_num_threads(default_num_threads())  # as the server does: far less CPU on shared cores
    out = tmp_path_factory.mktemp("adapters")
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    found: dict[str, Any] = {"ids": ids, "base": [_logprobs(model, i) for i in ids]}
    configs = {
        "A": peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
        "B": peft.LoraConfig(r=4, lora_alpha=8, target_modules=["k_proj", "v_proj"], init_lora_weights=False,
                             use_rslora=True),
    }  # fmt: skip
    for seed, (name, config) in enumerate(configs.items()):
        torch.manual_seed(seed)
        peft_model = peft.get_peft_model(model, config).eval()
        peft_model.save_pretrained(out / name)
        found[name] = [_logprobs(peft_model, i) for i in ids]
        model = peft_model.unload()
        found[f"{name}_dir"] = str(out / name)
    torch.set_num_threads(threads)
    return found


# ---- servers ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(model_path: str, adapters: dict[str, Any]) -> Iterator[Server]:
    flags = ["--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "q_proj", "v_proj",
             "--max-loras-per-batch", "2", "--lora-paths", f"A={adapters['A_dir']}"]  # fmt: skip
    with running_server(model_path, flags) as srv:
        # Read the log as it comes, so that tests can look at it and the pipe never fills.
        assert srv.proc.stdout is not None
        stdout = srv.proc.stdout
        threading.Thread(target=lambda: srv.lines.extend(iter(stdout.readline, "")), daemon=True).start()
        status, answer = post(srv.url + "/load_lora_adapter", {"lora_name": "B", "lora_path": adapters["B_dir"]})
        assert status == 200, answer
        yield srv


@pytest.fixture(scope="module")
def plain_server(model_path: str) -> Iterator[Server]:
    with running_server(model_path) as srv:
        yield srv


def _prompt_logprobs(server: Server, ids: list[int] | list[list[int]], lora: Any = None) -> Any:
    """The server's log p(ids[i] | ids[:i]) for i >= 1 (a list per prompt for a batch)."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True, "logprob_start_len": 0}  # fmt: skip
    if lora is not None:
        body["lora_path"] = lora
    answer = generated(server, body)
    rows = answer if isinstance(answer, list) else [answer]
    values = [[lp for lp, _, _ in row["meta_info"]["input_token_logprobs"][1:]] for row in rows]
    return values if isinstance(answer, list) else values[0]


def _close(a: list[float], b: list[float], tolerance: float = TOLERANCE) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) < tolerance


def _tensors_body(name: str, adapter_dir: str, **extra: Any) -> dict[str, Any]:
    """A /load_lora_adapter_from_tensors body as a client builds it: PEFT's tensors pickled by value."""
    from safetensors.torch import load_file

    tensors = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    config = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    entry = base64.b64encode(pickle.dumps(tensors)).decode()
    return {"lora_name": name, "config_dict": config, "serialized_named_tensors": [entry], **extra}


# ---- outputs -----------------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_an_adapters_logprobs_equal_peft_on_the_cpu_and_differ_from_the_base(server: Server, adapters: dict[str, Any]) -> None:
    for name in ("A", "B"):  # B is rslora: scaling alpha / sqrt(r), as PEFT computes it
        for ids, expected, base in zip(adapters["ids"], adapters[name], adapters["base"]):
            served = _prompt_logprobs(server, ids, name)
            assert _close(served, expected), (name, served, expected)
            assert max(abs(x - y) for x, y in zip(served, base)) > 0.1, (name, "the adapter changes nothing")
    assert _close(_prompt_logprobs(server, adapters["ids"][0]), adapters["base"][0])


@pytest.mark.timeout(180)
def test_each_row_of_a_mixed_batch_gets_its_own_adapter_as_if_sent_alone(server: Server, adapters: dict[str, Any]) -> None:
    # Base first and last, two adapters between: every row given the first (or the last) row's
    # adapter, or all rows one adapter, changes some row.
    ids, loras = adapters["ids"], [None, "A", "B", None]
    batched = _prompt_logprobs(server, ids, loras)
    for row, lora in enumerate(loras):
        expected = adapters["base" if lora is None else lora][row]
        assert _close(batched[row], expected), (row, lora)
        assert _close(batched[row], _prompt_logprobs(server, ids[row], lora), 1e-4), (row, lora)
    # n copies of a prompt share its adapter (a string, or a list with one name per prompt).
    for lora_path in ("B", ["B"]):
        copies = generated(server, {"input_ids": ids[1], "lora_path": lora_path, "return_logprob": True, "logprob_start_len": 0,
                                  "sampling_params": {"n": 2, "max_new_tokens": 1, "temperature": 0.0}})  # fmt: skip
        for copy in copies:
            assert _close([lp for lp, _, _ in copy["meta_info"]["input_token_logprobs"][1:]], adapters["B"][1])


@pytest.mark.timeout(180)
def test_a_row_whose_adapter_would_pass_max_loras_per_batch_waits_for_the_next_prefill(server: Server, adapters: dict[str, Any]) -> None:
    time.sleep(0.3)  # a prefill logs its line after its rows' answers: let the last test's come in
    seen = len(server.lines)
    body = {"input_ids": adapters["ids"][:3], "lora_path": ["A", "B", None], "sampling_params": {"max_new_tokens": 2}}
    assert len(generated(server, body)) == 3
    time.sleep(0.2)  # the log line of the last prefill comes after its answer
    prefills = [line.split("#new-seq: ")[1].split(",")[0] for line in server.lines[seen:] if "Prefill batch" in line]
    assert prefills == ["2", "1"], server.lines[seen:]  # {A, B} run, the base row waits (2 adapters per batch)


@pytest.mark.timeout(180)
def test_an_adapter_loaded_from_tensors_answers_like_the_same_adapter_loaded_from_its_directory(
    server: Server, adapters: dict[str, Any]
) -> None:
    body = _tensors_body("A_tensors", adapters["A_dir"])
    tensors = pickle.loads(base64.b64decode(body["serialized_named_tensors"][0]))
    sums = {n: hashlib.sha256(t.contiguous().flatten().view(torch.uint8).numpy().tobytes()).hexdigest() for n, t in tensors.items()}
    status, answer = post(server.url + "/load_lora_adapter_from_tensors", {**body, "expected_checksums": sums})
    assert status == 200 and answer["success"], answer
    assert answer["loaded_adapters"]["A_tensors"] == "__tensor__"
    ids = adapters["ids"][1]
    assert _prompt_logprobs(server, ids, "A_tensors") == _prompt_logprobs(server, ids, "A")

    wrong = {**sums, next(iter(sums)): "0" * 64}
    status, answer = post(server.url + "/load_lora_adapter_from_tensors",
                          {**_tensors_body("A_bad", adapters["A_dir"]), "expected_checksums": wrong})  # fmt: skip
    assert status == 400 and answer["error_message"].startswith("[LORA-CHECK] rank0 adapter sync MISMATCH"), answer


@pytest.mark.timeout(180)
def test_the_prefix_cache_never_serves_one_adapters_keys_and_values_to_another(server: Server, tok: Any) -> None:
    prefix = tok("In a quiet village by the sea, the old lighthouse keeper")["input_ids"]
    ids = prefix + tok(" told a story", add_special_tokens=False)["input_ids"]
    start = len(prefix)  # logprobs from here: the prefix may come from the cache

    def tail(lora: str | None) -> tuple[list[float], int]:
        """log p(ids[i] | ids[:i]) for i > start, and the prompt tokens the cache served."""
        body: dict[str, Any] = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                                "return_logprob": True, "logprob_start_len": start}  # fmt: skip
        if lora:
            body["lora_path"] = lora
        meta = generated(server, body)["meta_info"]
        return [lp for lp, _, _ in meta["input_token_logprobs"][1:]], meta["cached_tokens"]

    generated(server, {"input_ids": prefix, "sampling_params": {"max_new_tokens": 1}})  # the prefix cached by the base
    first, cached = tail("A")
    adapter_alone = _prompt_logprobs(server, ids, "A")[start:]  # logprob_start_len=0: no cached prefix is used
    assert cached == 0 and _close(first, adapter_alone), (cached, first, adapter_alone)
    again, cached = tail("A")  # now A's own entry serves the prefix
    assert cached == start and _close(again, adapter_alone), (cached, again, adapter_alone)
    base, cached = tail(None)
    assert cached == start and _close(base, _prompt_logprobs(server, ids)[start:]), (cached, base)
    # Another adapter of the same name gets a new id: the old one's cache is not reused.
    assert post(server.url + "/unload_lora_adapter", {"lora_name": "A"})[0] == 200
    reloaded, cached = tail("A")  # loaded again from its path by this request
    assert cached == 0 and _close(reloaded, adapter_alone), (cached, reloaded)


# ---- endpoints and errors ------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_loads_and_requests_sglang_refuses_get_its_400_and_its_text(server: Server, adapters: dict[str, Any]) -> None:
    status, answer = post(server.url + "/load_lora_adapter", {"lora_name": "B", "lora_path": adapters["B_dir"]})
    assert (status, answer["success"], answer["rid"]) == (400, False, None), answer
    assert answer["error_message"] == "Failed to load LoRA adapter B because it is already loaded"
    assert answer["loaded_adapters"]["B"] == adapters["B_dir"]

    too_big = _tensors_body("big", adapters["A_dir"])
    too_big["config_dict"] = {**too_big["config_dict"], "r": 16}
    status, answer = post(server.url + "/load_lora_adapter_from_tensors", too_big)
    assert status == 400 and answer["error_message"] == (
        "LoRA adapter big with rank 16 is incompatible with the current LoRA memory pool configuration. Please ensure "
        "that the LoRA adapter's rank is within the configured `--max-lora-rank` and that the target modules are "
        "included in `--lora-target-modules`."), answer  # fmt: skip
    other_modules = _tensors_body("mlp", adapters["A_dir"])
    other_modules["config_dict"] = {**other_modules["config_dict"], "target_modules": ["gate_proj"]}
    status, answer = post(server.url + "/load_lora_adapter_from_tensors", other_modules)
    assert status == 400 and "is incompatible with the current LoRA memory pool" in answer["error_message"], answer
    dora = _tensors_body("dora", adapters["A_dir"])
    dora["config_dict"] = {**dora["config_dict"], "use_dora": True}
    status, answer = post(server.url + "/load_lora_adapter_from_tensors", dora)
    assert answer["error_message"] == "Failed to load dora because LoRA serving currently doesn't support DoRA adapters"

    status, answer = post(server.url + "/unload_lora_adapter", {"lora_name": "nope"})
    assert status == 400 and answer["error_message"].startswith("LoRA with name nope does not exist. Loaded LoRAs: odict_keys(["), answer
    assert answer["loaded_adapters"] is None
    status, answer = post(server.url + "/generate", {"text": "hi", "lora_path": "nope"})
    assert status == 400 and answer["error"]["message"].startswith(
        "Got LoRA adapter that has never been loaded: nope\nAll loaded adapters: dict_keys(["), answer
    status, answer = post(server.url + "/generate", {"text": ["hi", "yo"], "lora_path": ["B"]})
    assert status == 400 and "lora_path" in answer["error"]["message"], answer


@pytest.mark.timeout(180)
def test_an_unloaded_adapter_is_loaded_again_from_its_path_by_the_next_request_and_from_tensors_it_is_not(
    server: Server, adapters: dict[str, Any]
) -> None:
    ids = adapters["ids"][2]
    assert post(server.url + "/load_lora_adapter", {"lora_name": "B2", "lora_path": adapters["B_dir"]})[0] == 200
    status, answer = post(server.url + "/unload_lora_adapter", {"lora_name": "B2"})
    assert status == 200 and answer["success"] and "B2" not in answer["loaded_adapters"], answer
    assert _close(_prompt_logprobs(server, ids, "B2"), adapters["B"][2])  # SGLang reloads it from lora_ref_cache

    assert post(server.url + "/load_lora_adapter_from_tensors", _tensors_body("B_tensors", adapters["B_dir"]))[0] == 200
    assert post(server.url + "/unload_lora_adapter", {"lora_name": "B_tensors"})[0] == 200
    status, answer = post(server.url + "/generate", {"input_ids": ids, "lora_path": "B_tensors"})
    assert status == 400 and answer["error"]["message"].startswith("Failed to implicitly load LoRA adapter B_tensors: ")


@pytest.mark.timeout(180)
def test_an_unload_waits_for_the_requests_that_use_the_adapter(server: Server, adapters: dict[str, Any]) -> None:
    assert post(server.url + "/load_lora_adapter", {"lora_name": "busy", "lora_path": adapters["A_dir"]})[0] == 200
    done: dict[str, Any] = {}

    def generate() -> None:
        body = {"input_ids": adapters["ids"][0], "lora_path": "busy",
                "sampling_params": {"max_new_tokens": 32, "ignore_eos": True}}  # fmt: skip
        done["answer"] = post(server.url + "/generate", body)

    thread = threading.Thread(target=generate)
    thread.start()
    while _running(server) == 0:  # the request runs
        time.sleep(0.02)
    assert "answer" not in done
    status, answer = post(server.url + "/unload_lora_adapter", {"lora_name": "busy"})
    # Read on the server, not by comparing two client threads' clocks (their answers arrive within
    # a millisecond of each other, in either order): when the unload answers, nothing runs.
    running_when_unloaded = _running(server)
    thread.join(60)
    assert status == 200 and "busy" not in answer["loaded_adapters"], answer
    assert running_when_unloaded == 0
    generated_status, generated = done["answer"]
    assert generated_status == 200 and generated["meta_info"]["completion_tokens"] == 32, generated


def _running(server: Server) -> int:
    with urllib.request.urlopen(server.url + "/v1/loads", timeout=10) as response:
        return int(json.load(response)["loads"][0]["num_running_reqs"])


@pytest.mark.timeout(60)
def test_server_info_reports_the_lora_flags_as_sglangs_server_args(server: Server, adapters: dict[str, Any]) -> None:
    with urllib.request.urlopen(server.url + "/server_info", timeout=10) as response:
        info = json.load(response)
    assert (info["enable_lora"], info["max_lora_rank"], info["lora_target_modules"]) == (True, 8, ["q_proj", "v_proj"])
    assert (info["max_loras_per_batch"], info["max_loaded_loras"]) == (2, None)
    (ref,) = info["lora_paths"]
    assert (ref["lora_name"], ref["lora_path"], ref["pinned"]) == ("A", adapters["A_dir"], False)


@pytest.mark.timeout(120)
def test_without_enable_lora_a_lora_path_or_a_load_gets_sglangs_not_enabled_400(plain_server: Server) -> None:
    status, answer = post(plain_server.url + "/generate", {"text": "hi", "lora_path": "A"})
    assert (status, answer) == (400, {"error": {"message": NOT_ENABLED.format("A")}})
    # SGLang tests the field's truthiness: a list of nulls asks for LoRA too.
    status, answer = post(plain_server.url + "/generate", {"text": ["a", "b"], "lora_path": [None, None]})
    assert (status, answer) == (400, {"error": {"message": NOT_ENABLED.format(None)}})
    assert post(plain_server.url + "/generate", {"text": "hi", "lora_path": "", "sampling_params": {"max_new_tokens": 1}})[0] == 200
    status, answer = post(plain_server.url + "/load_lora_adapter", {"lora_name": "A", "lora_path": "/nowhere"})
    assert (status, answer) == (400, {"rid": None, "http_worker_ipc": None, "success": False, "loaded_adapters": None,
                                      "error_message": "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."})


@pytest.mark.timeout(60)
def test_enable_lora_without_adapters_needs_a_rank_and_target_modules_or_the_server_exits(model_path: str) -> None:
    srv = Server(model_path, free_port(), args=["--enable-lora", "--max-lora-rank", "8"])
    try:
        assert srv.proc.wait(timeout=45) != 0
        assert ("AssertionError: When no initial --lora-paths is provided, you need to specify both --max-lora-rank "
                "and --lora-target-modules for LoRA initialization.") in srv.rest_of_output()  # fmt: skip
    finally:
        srv.kill()
