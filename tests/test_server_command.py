"""rlgen.server._command: backend choice and the server command line with rlgen's notebook defaults."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import rlgen
from rlgen.server._command import DEFAULT_GPU_MEMORY_FRACTION, choose_backend, server_argv


def argv(backend: str = "sglang", **kwargs) -> list[str]:
    options = dict(gpu_memory_fraction=DEFAULT_GPU_MEMORY_FRACTION, fast_start=False, enable_memory_saver=False,
                   enable_metrics=False, server_args=None)
    options.update(kwargs)
    return server_argv(backend, "/models/m", **options)


def test_sglang_defaults_cap_the_gpu_memory_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLGEN_SGLANG_ARGS", raising=False)
    assert argv() == [sys.executable, "-m", "sglang.launch_server", "--model-path", "/models/m",
                      "--mem-fraction-static", "0.2", "--cuda-graph-max-bs-decode", "512"]


@pytest.mark.parametrize("where", ["site", "user"])
@pytest.mark.parametrize("flag", ["--cuda-graph-max-bs", "--cuda-graph-bs-decode", "--disable-cuda-graph"])
def test_decode_graph_default_gives_way_to_any_graph_flag_of_the_site_or_user(
        monkeypatch: pytest.MonkeyPatch, where: str, flag: str) -> None:
    value = [] if flag == "--disable-cuda-graph" else ["64"]
    monkeypatch.setenv("RLGEN_SGLANG_ARGS", " ".join([flag, *value]) if where == "site" else "")
    args = argv(server_args=[flag, *value] if where == "user" else None)
    assert "--cuda-graph-max-bs-decode" not in args
    assert args[-1 - len(value):] == [flag, *value]


def test_fast_start_memory_saver_and_metrics_add_their_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLGEN_SGLANG_ARGS", raising=False)
    args = argv(fast_start=True, enable_memory_saver=True, enable_metrics=True)
    assert "--disable-cuda-graph" not in args  # decode graphs stay: decode is ~6x slower without
    for flag in ("--disable-prefill-cuda-graph", "--skip-server-warmup", "--enable-memory-saver", "--enable-metrics"):
        assert flag in args


def test_site_flags_come_before_the_users_and_the_user_wins_on_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLGEN_SGLANG_ARGS", "--attention-backend triton")
    args = argv(server_args={"mem_fraction_static": 0.5, "disable_radix_cache": True, "log_level": None})
    assert "0.2" not in args  # the user's mem_fraction_static replaces rlgen's default
    assert args[-5:] == ["--attention-backend", "triton", "--mem-fraction-static", "0.5", "--disable-radix-cache"]


def test_server_args_as_a_list_pass_through_and_bad_types_say_what_is_expected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLGEN_SGLANG_ARGS", raising=False)
    assert argv(server_args=["--tp", "2"])[-2:] == ["--tp", "2"]
    with pytest.raises(TypeError, match="dict or a list of strings"):
        argv(server_args="--tp 2")


def test_the_cpu_backend_runs_rlgens_own_server() -> None:
    assert argv("cpu", enable_metrics=True)[:5] == [sys.executable, "-m", "rlgen.cpu_server", "--model-path", "/models/m"]
    assert "--enable-metrics" in argv("cpu", enable_metrics=True)


def test_backend_choice_checks_its_argument_and_names_the_extra() -> None:
    with pytest.raises(ValueError, match="'auto', 'sglang' or 'cpu'"):
        choose_backend("gpu")
    assert choose_backend("cpu") == "cpu"
    if importlib.util.find_spec("sglang") is None:
        with pytest.raises(rlgen.EngineError, match=r"pip install 'rlgen\[sglang\]'"):
            choose_backend("sglang")
        assert choose_backend("auto") == "cpu"


def test_tp_and_dp_sizes_become_sglangs_flags_and_a_users_own_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLGEN_SGLANG_ARGS", raising=False)
    assert "--tp-size" not in argv() and "--dp-size" not in argv()
    args = argv(tp_size=2, dp_size=4)
    assert args[args.index("--tp-size") + 1] == "2" and args[args.index("--dp-size") + 1] == "4"
    own = argv(tp_size=2, server_args={"tp_size": 8})
    assert own.count("--tp-size") == 1 and own[own.index("--tp-size") + 1] == "8"


@pytest.mark.parametrize("sizes", [{"tp_size": 0}, {"dp_size": -1}, {"tp_size": 1.5}, {"dp_size": True}])
def test_bad_tp_or_dp_sizes_are_refused(sizes: dict) -> None:
    with pytest.raises(ValueError, match="must be an int >= 1"):
        argv(**sizes)


def test_the_cpu_backend_refuses_parallelism_and_says_what_needs_it() -> None:
    assert argv("cpu", tp_size=1, dp_size=1)[2] == "rlgen.cpu_server"
    with pytest.raises(ValueError, match="need SGLang on GPUs"):
        argv("cpu", dp_size=2)


def test_choosing_the_backend_with_sglang_installed_does_not_import_torch(tmp_path) -> None:
    # A fresh kernel reattaching on the GPU machine paid torch's import (3.8-4.3 s) only to run
    # torch.cuda.is_available() here. With sglang "installed" and no CUDA driver: "cpu", no torch.
    code = ("import importlib.util, sys\n"
            "real = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda name, *a: object() if name == 'sglang' else real(name, *a)\n"
            "from rlgen.server._command import choose_backend, cuda_device_count\n"
            "print(choose_backend('auto'), cuda_device_count(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["cpu", "0", "False"]


def test_the_default_memory_share_adds_the_weights_share_to_the_caches(tmp_path: Path) -> None:
    from rlgen.server._command import memory_fraction

    (tmp_path / "model-00001.safetensors").write_bytes(b"\0" * (14 << 20))  # 14 MiB of "weights"
    assert memory_fraction(str(tmp_path), gpu_total_mib=140) == 0.3           # 0.2 + 14/140
    assert memory_fraction(str(tmp_path), gpu_total_mib=140, tp_size=2) == 0.25
    assert memory_fraction(str(tmp_path), gpu_total_mib=10) == 0.9            # never the whole GPU
    assert memory_fraction(str(tmp_path), gpu_total_mib=None) == DEFAULT_GPU_MEMORY_FRACTION
    assert memory_fraction(str(tmp_path / "missing"), gpu_total_mib=140) == DEFAULT_GPU_MEMORY_FRACTION
