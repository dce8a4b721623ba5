"""What server to launch: the backend choice and the server command line, with rlgen's defaults.

Owns: choosing between SGLang and the CPU backend, and turning the Engine's options into the argv
of `python -m sglang.launch_server ...` or `python -m rlgen.cpu_server ...` (notebook-friendly
memory defaults, decode CUDA graphs up to batch 512, `fast_start`, site-wide flags from
RLGEN_SGLANG_ARGS, and the user's own `server_args`, which win). Knows nothing about processes,
ports or HTTP.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core._errors import EngineError

__all__ = ["DEFAULT_DECODE_GRAPH_MAX_BS", "DEFAULT_GPU_MEMORY_FRACTION", "SGLANG_ARGS_ENV", "api_key_of", "choose_backend", "cuda_device_count", "lora_flags", "mapping_flags", "memory_fraction",
           "redacted", "server_argv"]

# Fraction of the GPU's memory the SGLang server may take by default. SGLang's own default (~0.9)
# fills a large GPU with KV cache whatever the model's size; a notebook shares its GPU with its
# own torch work, and a small model's batches fit well within a fifth (docs/benchmarks.md).
DEFAULT_GPU_MEMORY_FRACTION = 0.2
# Largest decode batch SGLang captures a CUDA graph for. SGLang picks 256 on an 80-160 GB GPU
# whatever the model, and a batch above it decodes eagerly, several times slower; rlgen's users run
# large batches of small models, for which graphs to 512 cost about a second of start-up and little
# memory (docs/benchmarks.md has the measurements).
DEFAULT_DECODE_GRAPH_MAX_BS = 512
# Flags by which the user or the site has chosen the decode graphs themselves.
_GRAPH_FLAGS = ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", "--cuda-graph-bs", "--cuda-graph-bs-decode",
                "--cuda-graph-config", "--disable-cuda-graph", "--disable-decode-cuda-graph")
# Extra server flags for every SGLang launch, e.g. "--attention-backend triton" on a machine
# without FA3 kernels. Appended before the user's `server_args`.
SGLANG_ARGS_ENV = "RLGEN_SGLANG_ARGS"


def memory_fraction(model_path: str, *, gpu_total_mib: int | None, tp_size: int = 1) -> float:
    """rlgen's default share of the GPU for a server of this model: DEFAULT_GPU_MEMORY_FRACTION for the
    KV cache and activations, plus the share the weights take (per GPU: tp_size splits them), so that
    a large model's weights do not come out of the cache a small one gets (docs/archive/benchmarks-rounds-2026-12.md,
    "Model sizes"). The default alone where the GPU's size or
    the weights' (safetensors or .bin files in the checkout) are unknown; at most 0.9."""
    root = Path(model_path)
    files = list(root.glob("*.safetensors")) or list(root.glob("*.bin")) if root.is_dir() else []
    weights = sum(f.stat().st_size for f in files)
    if not weights or not gpu_total_mib:
        return DEFAULT_GPU_MEMORY_FRACTION
    share = weights / tp_size / (gpu_total_mib * (1 << 20))
    return round(min(0.9, DEFAULT_GPU_MEMORY_FRACTION + share), 3)


def choose_backend(backend: str) -> str:
    if backend not in ("auto", "sglang", "cpu"):
        raise ValueError(f"backend must be 'auto', 'sglang' or 'cpu', got {backend!r}")
    has_sglang = importlib.util.find_spec("sglang") is not None
    if backend == "sglang":
        if not has_sglang:
            raise EngineError("backend='sglang' needs SGLang: pip install 'rlgen[sglang]' (on a CUDA machine)")
        return "sglang"
    if backend == "cpu":
        return "cpu"
    if has_sglang and cuda_device_count() > 0:
        return "sglang"
    return "cpu"


def cuda_device_count() -> int:
    """How many CUDA devices this process may use (CUDA_VISIBLE_DEVICES honoured), asked of the
    driver (libcuda's cuInit + cuDeviceGetCount) without importing torch: a fresh kernel that
    reattaches to a kept server would otherwise pay torch's import (3.8-4.3 s on the H200
    machine) only to choose the backend. torch's own answer is used when torch is already imported.
    0 when there is no driver or it fails."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    import ctypes

    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return int(count.value)


def redacted(argv: Sequence[str]) -> list[str]:
    """`argv` with the value of `--api-key` replaced by "***", for logs and registry records."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--api-key" and i + 1 < len(out):
            out[i + 1] = "***"
        elif arg.startswith("--api-key="):
            out[i] = "--api-key=***"
    return out


def api_key_of(argv: Sequence[str]) -> str | None:
    """The value of `--api-key` in `argv` (the last one, as argparse reads it): the key the server
    will require, or None."""
    key = None
    for i, arg in enumerate(argv):
        if arg == "--api-key" and i + 1 < len(argv):
            key = argv[i + 1]
        elif arg.startswith("--api-key="):
            key = arg[len("--api-key="):]
    return key


def server_argv(
    backend: str,
    model_path: str,
    *,
    gpu_memory_fraction: float,
    fast_start: bool,
    enable_memory_saver: bool,
    enable_metrics: bool,
    server_args: Mapping[str, Any] | Sequence[str] | None,
    tp_size: int = 1,
    dp_size: int = 1,
    lora: Mapping[str, Any] | None = None,
) -> list[str]:
    """The server command: rlgen's defaults first, then RLGEN_SGLANG_ARGS, then the user's args.

    `tp_size` / `dp_size` are SGLang's tensor and data parallelism over this host's GPUs
    (`--tp-size`, `--dp-size`); the CPU backend has one process and refuses more. `lora`: resolved
    `core._options.LoraOptions`, or None for no LoRA serving (`lora_flags`)."""
    for name, size in (("tp_size", tp_size), ("dp_size", dp_size)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be an int >= 1, got {size!r}")
    user = _flags(server_args)
    if backend == "cpu":
        if tp_size > 1 or dp_size > 1:
            raise ValueError(f"tp_size={tp_size}, dp_size={dp_size}: the CPU backend runs one process on the CPU; "
                             "tensor and data parallelism need SGLang on GPUs (backend='sglang')")
        argv = [sys.executable, "-m", "rlgen.cpu_server", "--model-path", model_path]
        if enable_metrics:
            argv.append("--enable-metrics")
        return argv + lora_flags(lora) + user
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path]
    defaults: list[str] = []
    if not _has_flag(user, "--mem-fraction-static"):
        defaults += ["--mem-fraction-static", f"{gpu_memory_fraction:g}"]
    site = shlex.split(os.environ.get(SGLANG_ARGS_ENV, ""))
    if not any(_has_flag(site + user, flag) for flag in _GRAPH_FLAGS):
        defaults += ["--cuda-graph-max-bs-decode", str(DEFAULT_DECODE_GRAPH_MAX_BS)]
    if fast_start:
        # Prefill-graph capture and the warm-up request are the part of a restart that can go;
        # decode graphs stay, because decode without them is several times slower
        # (docs/benchmarks.md).
        defaults += ["--disable-prefill-cuda-graph", "--skip-server-warmup"]
    if enable_memory_saver:
        defaults.append("--enable-memory-saver")
    if enable_metrics:
        defaults.append("--enable-metrics")
    for flag, size in (("--tp-size", tp_size), ("--dp-size", dp_size)):
        if size > 1 and not _has_flag(user, flag):
            defaults += [flag, str(size)]
    return argv + defaults + lora_flags(lora) + site + user


def lora_flags(lora: Mapping[str, Any] | None) -> list[str]:
    """SGLang's LoRA serving flags for resolved `LoraOptions` (the CPU backend takes the same):
    `--enable-lora`, the largest rank and the target modules (which SGLang needs when no adapter
    is given at start), adapters per batch, and the adapters to load at start as `name=path`."""
    if lora is None:
        return []
    flags = ["--enable-lora", "--max-lora-rank", str(lora["max_rank"]), "--lora-target-modules",
             *lora["target_modules"], "--max-loras-per-batch", str(lora["max_loras_per_batch"])]
    if lora["adapters"]:
        flags += ["--lora-paths", *(f"{name}={os.path.abspath(path)}" for name, path in lora["adapters"].items())]
    return flags


def mapping_flags(options: Mapping[str, Any]) -> list[str]:
    """Command-line flags from a dict, as SGLang and sglang-router spell them: {"retry_max_retries": 10}
    -> ["--retry-max-retries", "10"]; True -> a bare flag; False or None -> left out; a list -> its
    values after the flag."""
    out: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-").lstrip("-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def _flags(server_args: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    if server_args is None:
        return []
    if isinstance(server_args, Mapping):
        return mapping_flags(server_args)
    if isinstance(server_args, (str, bytes)) or not all(isinstance(a, str) for a in server_args):
        raise TypeError("server_args must be a dict or a list of strings, e.g. ['--attention-backend', 'triton']")
    return list(server_args)


def _has_flag(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)
