"""Reading a server's start-up log: phases, tails and one-line diagnoses.

Owns: what rlgen takes from a server's `server.log` while and after it starts. The start-up phases
(`PHASES`, mapped forward-only from the phrases SGLang and the CPU backend print), the log tail
shown in errors (progress-bar redraws collapsed to what a terminal would show), the table of known
fatal signatures and the hint each gives, and the `ServerStartupError` built from them. Also the
prefix of the header lines rlgen itself writes into the log, which every reader here skips.

Knows nothing about processes, ports or HTTP: to this module a server is a log file and, once it
exited, an exit code. Writing the log (the child's stdout and stderr) is `server/_process.py`'s job.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import TypeVar

from ..core._errors import ServerStartupError, ServerStartupTimeout

__all__ = [
    "LOG_HEADER",
    "PHASES",
    "PORT_IN_USE_HINT",
    "TAIL_LINES",
    "LogFollower",
    "PhaseTracker",
    "describe_exit",
    "is_port_clash",
    "match_hint",
    "read_tail_lines",
    "startup_error",
    "timeout_error",
]

_E = TypeVar("_E", bound=ServerStartupError)

# The start-up phases reported to `on_phase`, in order.
PHASES = ("launching", "loading weights", "allocating KV cache", "capturing CUDA graphs", "warming up", "ready")

# Log phrases (lower-cased) that SGLang prints while starting, and the phase each one begins. The
# CPU backend prints the same phrases. "ready" is never taken from the log: only a 200 from the
# health probe means ready (SGLang prints "fired up" just before its health check passes).
_PHASE_MARKERS: tuple[tuple[str, str], ...] = (
    ("load weight begin", "loading weights"),
    ("load weight end", "allocating KV cache"),
    ("kv cache is allocated", "allocating KV cache"),
    ("capture cuda graph begin", "capturing CUDA graphs"),
    ("capture cuda graph end", "warming up"),
    ("uvicorn running on", "warming up"),
    ("the server is fired up and ready to roll", "warming up"),
)

LOG_HEADER = "[rlgen] "  # prefix of the lines rlgen itself writes into the server log
TAIL_LINES = 40  # log lines an error shows

_PORT_IN_USE_PATTERN = r"address already in use|\[Errno 98\]|\[Errno 48\]"  # EADDRINUSE: Linux, macOS
PORT_IN_USE_HINT = "the port is already in use: pass another port=, or leave port unset so rlgen picks a free one"

# Known fatal start-up signatures, first match wins (so specific patterns come before general ones).
# A template may use the pattern's first group as {0}.
_HINTS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE | re.MULTILINE), hint)
    for pattern, hint in (
        (r"^\s*(?:ModuleNotFoundError|ImportError): No module named 'sglang'",
         "SGLang is not installed in the server's Python: pip install 'rlgen[sglang]'"),
        (
            # SGLang 0.5.17, when two servers start on one GPU at the same time: each counts the
            # other's allocations while sizing its KV cache.
            r"Loaded weights leave no GPU memory for the KV cache",
            "no GPU memory was left for the KV cache: another process took memory while the server "
            "measured it (engines started at the same time on one GPU?): start engines one after "
            "another, or raise gpu_memory_fraction",
        ),
        (
            r"Not enough memory\. Please try to increase --mem-fraction-static",
            "too little GPU memory is left for the KV cache after loading the weights: raise "
            "mem_fraction_static, or free the GPU (see nvidia-smi for other processes)",
        ),
        (
            r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory",
            "the GPU ran out of memory: lower mem_fraction_static / the KV-cache budget, or free the GPU "
            "(see nvidia-smi for other processes)",
        ),
        (_PORT_IN_USE_PATTERN, PORT_IN_USE_HINT),
        (
            # A running server whose model produced NaN/inf logits (seen on SGLang 0.5.17 after
            # loading weights a bf16-autocast training step had made NaN): torch's multinomial
            # asserts on the GPU, the scheduler dies and SGLang SIGKILLs its own process tree.
            r"probability tensor contains either `?inf`?, `?nan`? or element < 0",
            "the model produced NaN or inf probabilities, so the server's sampler crashed and SGLang stopped "
            "its own processes: check the weights last loaded (e.g. torch.isfinite on a trained model's "
            "parameters) and start a new Engine",
        ),
        (
            r"Scheduler hit an exception",
            "the server's scheduler crashed (its traceback is in the log) and SGLang stopped its own "
            "processes: start a new Engine; if it happens again, the log's traceback says why",
        ),
        (
            r"CUDA driver version is insufficient|no kernel image is available for execution"
            r"|forward compatibility was attempted|unsupported display driver / cuda driver combination",
            "the CUDA build of torch/SGLang does not match this GPU's driver or architecture: install "
            "wheels built for the CUDA version that nvidia-smi reports",
        ),
        (
            r"Found no NVIDIA driver|no CUDA-capable device is detected|Torch not compiled with CUDA enabled",
            "no usable CUDA GPU in the server's environment: check nvidia-smi and CUDA_VISIBLE_DEVICES, "
            "or use the CPU backend",
        ),
        (
            r"401 Client Error|gated repo|is restricted\. You must have access",
            "Hugging Face refused the model download (gated or private repo): run `huggingface-cli login`, "
            "or pass a local checkout",
        ),
        (
            r"does not appear to have a file named config\.json|Repository Not Found|is not a valid model identifier"
            r"|Incorrect path_or_model_id|HFValidationError|Repo id must be in the form|Unrecognized model in"
            r"|Can't load (?:the )?(?:configuration|tokenizer)|Couldn't instantiate the backend tokenizer"
            r"|model path .{0,200}(?:does not exist|not found)|LocalEntryNotFoundError|couldn't connect to 'https://huggingface\.co'",
            "the model path is missing or is not a valid Hugging Face checkout (config.json, tokenizer, "
            "weights): check model_path=",
        ),
        # Only a real import failure, not SGLang's "Ignore import error when loading ...: No module named".
        (r"^\s*(?:ModuleNotFoundError|ImportError): No module named '([\w]+)",
         "a Python package is missing in the server's environment: pip install {0}"),
    )
)
_TIMEOUT_HINT = (
    "raise startup_timeout= (a first start compiles kernels and captures CUDA graphs), or see the log "
    "for where it stopped"
)


# ---------------------------------------------------------------------------------------------
# Phases


class LogFollower:
    """Reads a growing log file incrementally: each call returns the complete lines added since."""

    def __init__(self, log_path: Path) -> None:
        self._path = log_path
        self._offset = 0
        self._partial = ""

    def new_lines(self) -> list[str]:
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return []
        self._offset += len(chunk)
        # \r too: progress bars in the log rewrite their line
        *lines, self._partial = re.split(r"[\r\n]", self._partial + chunk.decode("utf-8", errors="replace"))
        return lines


class PhaseTracker:
    """Reads the log incrementally and maps SGLang's start-up phrases to PHASES (forward only)."""

    def __init__(self, log_path: Path) -> None:
        self._follower = LogFollower(log_path)
        self.phase = PHASES[0]

    def update(self) -> str:
        for line in self._follower.new_lines():
            lower = line.lower()
            for marker, phase in _PHASE_MARKERS:
                if marker in lower and PHASES.index(phase) > PHASES.index(self.phase):
                    self.phase = phase
        return self.phase


# ---------------------------------------------------------------------------------------------
# Log reading and diagnosis


def _read_log_text(log_path: Path, max_bytes: int = 256 * 1024) -> str:
    """The end of the log, without rlgen's own header lines."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(line for line in text.split("\n") if not line.startswith(LOG_HEADER))


def read_tail_lines(log_path: Path, n: int) -> list[str]:
    # A progress bar redraws one line with \r: keep what a terminal would show (the last redraw).
    lines = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in _read_log_text(log_path).split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines[-n:] if n > 0 else []


def match_hint(log_path: Path) -> str:
    """A one-line diagnosis from the known signatures, or ""."""
    text = _read_log_text(log_path)
    for pattern, hint in _HINTS:
        match = pattern.search(text)
        if match:
            return hint.format(*(g or "" for g in match.groups()))
    return ""


def is_port_clash(log_path: Path) -> bool:
    return re.search(_PORT_IN_USE_PATTERN, _read_log_text(log_path), re.IGNORECASE) is not None


def startup_error(message: str, code: int | None, log_path: Path) -> ServerStartupError:
    """The error for a server that exited while starting: exit code, log tail and hint."""
    hint = _exit_hint(code, log_path, killed="it was SIGKILLed, often by the host's out-of-memory killer: "
                                             "check free RAM and `dmesg`")
    return _with_log(ServerStartupError, message, code, log_path, hint)


def died_hint(code: int | None, log_path: Path) -> str:
    """A hint for a server that was running and is gone: a known log signature, else its signal."""
    return _exit_hint(code, log_path, killed=(
        "something outside rlgen SIGKILLed it: the out-of-memory killer (check `dmesg`), or "
        "`sglang.Engine.shutdown()` in this process, which kills every child process; start a new Engine"))


def _exit_hint(code: int | None, log_path: Path, *, killed: str) -> str:
    """A known signature in the log, else `killed` if SIGKILL ended the process, else ""."""
    hint = match_hint(log_path)
    if not hint and code is not None and code == -signal.SIGKILL:
        hint = killed
    return hint


def timeout_error(message: str, log_path: Path) -> ServerStartupTimeout:
    """The error for a server that did not become healthy in time: log tail and hint."""
    return _with_log(ServerStartupTimeout, message, None, log_path, match_hint(log_path) or _TIMEOUT_HINT)


def _with_log(cls: type[_E], message: str, code: int | None, log_path: Path, hint: str) -> _E:
    return cls(
        message,
        exit_code=code,
        log_path=str(log_path),
        log_tail="\n".join(read_tail_lines(log_path, TAIL_LINES)),
        hint=hint,
    )


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is not running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
