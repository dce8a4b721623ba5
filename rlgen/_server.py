"""Launching, watching, stopping and reaping a server process.

Owns: the server's process tree (SGLang's `python -m sglang.launch_server ...` or rlgen's
`python -m rlgen.cpu_server ...`), its port, its log file, its readiness, its shutdown, and the
reaping of servers whose owner died (`reap()`, on top of the records in `_registry.py`).

Knows nothing about /generate payloads, sampling parameters, tokenizers or results: to this module
a server is an argv that binds `--host H --port N` and answers `GET /health_generate` with 200
once it can generate.

How a server is owned (each point answers a failure seen in the wild: orphaned servers holding a
GPU, Ctrl-C killing the server, hidden start-up errors, port races):

- **Own session.** The child is started with `start_new_session=True`, so it is not in the
  Jupyter kernel's process group: "Interrupt kernel" (SIGINT to that group) does not reach it.
- **Parent-death signal (Linux).** The child is exec'd through `setpriv --pdeathsig KILL --` (or,
  without setpriv, a tiny Python shim that calls `prctl(PR_SET_PDEATHSIG, SIGKILL)` and checks that
  its parent is still the launcher before exec'ing). The kernel then SIGKILLs the server when its
  owner dies, even by SIGKILL. Caveats, from prctl(2):
  - The signal fires when the *thread* that forked the child exits, not the process. Servers are
    therefore spawned from the main thread, or else from one long-lived daemon thread of this
    module (never from a caller's short-lived worker thread).
  - It covers the direct child only. SGLang arms the same signal in its own children: the
    scheduler and detokenizer processes call `kill_itself_when_parent_died()` (from
    `sglang.srt.utils`) first thing, and `sglang/launch_server.py` wraps the server in
    `try/finally: kill_process_tree(os.getpid(), include_parent=False)`; so when the SGLang main
    process dies its workers follow. They also stay in its process group, which `close()` signals
    as a whole. Other grandchildren survive an owner SIGKILL; `reap()` finds them by group.
  - setpriv leaves a window of about a millisecond between fork and prctl during which an owner
    death goes unnoticed; the registry (`reap()`) is the backstop for that and for macOS, which
    has no parent-death signal at all.
- **Readiness.** `GET /health_generate` every 0.5 s, with `proc.poll()` checked each time, so a
  crash is reported within one interval. The probe is only sent once a process of our own tree
  listens on the port: an auto-picked port can be taken by another process before the server binds
  it, and that process's answer must not pass for ours (the server then exits with "address
  already in use" and is relaunched on a fresh port, up to 3 times).
- **Registry.** Each server writes `<cache>/servers/registry/<pid>.json` (see `_registry.py`),
  removed on close; `reap()` stops servers whose owner is gone.
- **Shutdown.** `close()` (also run by `weakref.finalize` at garbage collection and at interpreter
  exit; `__del__` is not used) sends SIGTERM to the group, waits `grace` seconds, sends SIGKILL to
  the group, then kills any process of the tree recorded while it was alive (descendants that left
  the group with setsid). It never signals the calling process or its group.
"""

from __future__ import annotations

import contextlib
import enum
import http.client
import itertools
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from queue import SimpleQueue
from typing import Any

import psutil

from . import _registry
from ._errors import ServerDiedError, ServerStartupError, ServerStartupTimeout

__all__ = [
    "PHASES",
    "ServerProcess",
    "ServerState",
    "ShutdownReport",
    "launch_server",
    "list_servers",
    "print_phase",
    "reap",
    "wait_gpu_memory_released",
]

list_servers = _registry.list_servers

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

_PORT_IN_USE_PATTERN = r"address already in use|\[Errno 98\]|\[Errno 48\]"  # EADDRINUSE: Linux, macOS
_PORT_IN_USE_HINT = "the port is already in use: pass another port=, or leave port unset so rlgen picks a free one"

# Known fatal start-up signatures, first match wins (so specific patterns come before general ones).
# A template may use the pattern's first group as {0}.
_HINTS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE | re.MULTILINE), hint)
    for pattern, hint in (
        (r"^\s*(?:ModuleNotFoundError|ImportError): No module named 'sglang'",
         "SGLang is not installed in the server's Python: pip install 'rlgen[sglang]'"),
        (
            # SGLang 0.5.17, seen on an H200 when two servers started on one GPU at the same time:
            # each counted the other's allocations while sizing its KV cache.
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
        (_PORT_IN_USE_PATTERN, _PORT_IN_USE_HINT),
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

_POLL_INTERVAL_S = 0.5
_PROBE_TIMEOUT_S = 5.0  # one GET /health_generate; a dying server resets the connection at once
_PORT_RETRIES = 3  # relaunches on a fresh port after "address already in use" (auto-picked ports only)
_FAILED_START_GRACE_S = 1.0  # a server that failed to start holds nothing worth a long goodbye
_KILL_WAIT_S = 3.0  # after SIGKILL, how long to wait for the kernel to remove the processes
_TAIL_LINES = 40
_LOG_HEADER = "[rlgen] "  # prefix of the lines rlgen itself writes into the server log
_run_counter = itertools.count(1)


class ServerState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"  # it never became ready (start-up error, timeout, Ctrl-C)
    CLOSED = "closed"


@dataclass(frozen=True)
class ShutdownReport:
    """What `close()` did.

    Attributes:
        exit_code: the server's exit code (negative: killed by that signal), None if unknown.
        escalated: True if something had to be SIGKILLed after the grace period.
        leftover_pids: processes of the tree still alive afterwards (should be empty).
        seconds: how long the shutdown took.
    """

    exit_code: int | None
    escalated: bool
    leftover_pids: tuple[int, ...]
    seconds: float

    @property
    def clean(self) -> bool:
        return not self.leftover_pids


# ---------------------------------------------------------------------------------------------
# The public entry point


def launch_server(
    argv: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    env: Mapping[str, str | None] | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    startup_timeout: float = 600.0,
    health_path: str = "/health_generate",
    on_phase: Callable[[str, float], None] | None = None,
    grace: float = 5.0,
    _pdeathsig: bool = True,
) -> ServerProcess:
    """Start a server and return once it answers its health probe with 200.

    Args:
        argv: the command without `--host`/`--port` (rlgen appends them), e.g.
            `[sys.executable, "-m", "sglang.launch_server", "--model-path", path]`.
        host: the address the server binds; loopback by default (SGLang's own helpers bind
            0.0.0.0, exposing the server to the network).
        port: a fixed port, or None to pick a free one (and relaunch on a fresh one, up to 3 times,
            if another process grabs it first).
        env: variables to set (or, with a None value, remove) on top of this process's environment.
        log_dir: where `server.log` goes; default a new directory under `<cache>/servers/`.
        startup_timeout: seconds until ServerStartupTimeout. A first SGLang start on a new machine
            takes minutes (kernel compilation, CUDA-graph capture).
        health_path: the readiness probe; `/health_generate` runs a real one-token generation.
        on_phase: called about every 0.5 s while starting with (phase, seconds since launch);
            phase is one of PHASES and only moves forward. `print_phase` is a ready-made one.
        grace: seconds between SIGTERM and SIGKILL when the server is closed.
        _pdeathsig: private, for tests: False launches without the parent-death signal, as on a
            platform that lacks one.

    Raises:
        ServerStartupError: the server exited while starting (exit code, log tail, hint).
        ServerStartupTimeout: it did not become healthy within `startup_timeout`.
        KeyboardInterrupt: Ctrl-C while waiting; the server is stopped first.

    Call it from the main thread or a thread that outlives the server (see the module docstring);
    from any other thread the spawn is handed to a long-lived thread of this module.
    """
    config = _LaunchConfig.validated(
        argv=argv,
        host=host,
        port=port,
        env=env,
        log_dir=log_dir,
        startup_timeout=startup_timeout,
        health_path=health_path,
        on_phase=on_phase,
        grace=grace,
        pdeathsig=_pdeathsig,
    )
    server = ServerProcess(config)
    server._start()
    return server


def print_phase(phase: str, elapsed_s: float) -> None:
    """A default `on_phase`: one line on stderr, rewritten in place with a carriage return."""
    end = "\n" if phase == "ready" else ""
    sys.stderr.write(f"\r[rlgen] server: {phase:<22} {elapsed_s:6.1f} s{end}")
    sys.stderr.flush()


# ---------------------------------------------------------------------------------------------
# The server object


class ServerProcess:
    """One server process tree this Python process launched and owns. Create it with `launch_server`.

    Use it as a context manager, or call `close()`; if neither happens, the tree is stopped when
    the object is garbage-collected or the interpreter exits.
    """

    def __init__(self, config: _LaunchConfig) -> None:
        self._config = config
        self._state = ServerState.STARTING
        self._run_dir = _new_run_dir(config.log_dir)
        self._port: int | None = None
        # Everything the finalizer needs lives in `_owned`, which holds no reference back to this
        # object: a finalizer that referenced `self` would keep it alive forever.
        self._owned = _Owned(grace=config.grace)
        self._finalizer = weakref.finalize(self, self._owned.stop)

    # -- introspection -------------------------------------------------------------------------

    @property
    def state(self) -> ServerState:
        return self._state

    @property
    def pid(self) -> int | None:
        tree = self._owned.tree
        return tree.proc.pid if tree else None

    @property
    def pgid(self) -> int | None:
        tree = self._owned.tree
        return tree.pgid if tree else None

    @property
    def host(self) -> str:
        return self._config.host

    @property
    def port(self) -> int | None:
        return self._port

    @property
    def url(self) -> str:
        """The base URL to send requests to (a wildcard bind address is reached over loopback)."""
        host = _connect_host(self._config.host)
        return f"http://{'[' + host + ']' if ':' in host else host}:{self._port}"

    @property
    def log_path(self) -> Path:
        return self._run_dir / "server.log"

    @property
    def argv(self) -> list[str]:
        """The command as given, plus the `--host`/`--port` rlgen appended (without the shim)."""
        return [*self._config.argv, "--host", self._config.host, "--port", str(self._port)]

    @property
    def exit_code(self) -> int | None:
        """The server's exit code once it exited (negative: killed by that signal), else None."""
        tree = self._owned.tree
        return tree.proc.poll() if tree else None

    def alive(self) -> bool:
        """True while the server process runs: not exited, and not in the middle of exiting."""
        tree = self._owned.tree
        return tree is not None and tree.proc.poll() is None and not _is_exiting(tree.proc.pid)

    def assert_alive(self) -> None:
        """Raise ServerDiedError (exit code, log tail) if the server process is gone or going.

        The client calls this when a request fails with a connection error, so the user sees why
        the server died instead of "connection refused".
        """
        if self._state is ServerState.CLOSED:
            raise ServerDiedError("the server was closed", log_path=str(self.log_path))
        if self.alive():
            return
        tree = self._owned.tree
        if tree is not None:
            # It may still be tearing down: give it a moment to report its exit code.
            with contextlib.suppress(subprocess.TimeoutExpired):
                tree.proc.wait(timeout=_KILL_WAIT_S)
        code = self.exit_code
        raise ServerDiedError(
            f"the server (pid {self.pid}) {_describe_exit(code)}",
            exit_code=code,
            log_path=str(self.log_path),
            log_tail=self.log_tail(),
        )

    def log_tail(self, n: int = _TAIL_LINES) -> str:
        """The last `n` lines of the server log (progress-bar redraws collapsed to their last state)."""
        return "\n".join(_read_tail_lines(self.log_path, n))

    def pids(self) -> list[int]:
        """Every process of the tree seen so far (the server first) that is still alive."""
        tree = self._owned.tree
        if tree is None:
            return []
        tree.refresh()
        return [pid for pid, ctime in tree.known.items() if _registry.process_alive(pid, ctime)]

    def wait_gpu_memory_released(self, timeout: float = 30.0) -> bool | None:
        """After `close()`: wait until no process of this server holds GPU memory.

        Returns True once released, False on timeout, None where it cannot tell (no GPU, no
        nvidia-smi or pynvml). Call it before starting a new server on the same GPU.
        """
        tree = self._owned.tree
        return wait_gpu_memory_released(list(tree.known) if tree else [], timeout=timeout)

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self, *, grace: float | None = None) -> ShutdownReport:
        """Stop the server tree: SIGTERM to the group, `grace` s, SIGKILL, sweep. Idempotent:
        later calls return the first call's report."""
        if grace is not None:
            _check_nonnegative("grace", grace)
            self._owned.grace = grace
        self._finalizer()  # runs _Owned.stop at most once, whoever calls first
        if self._state is not ServerState.FAILED:
            self._state = ServerState.CLOSED
        with self._owned.lock:  # another thread's close() may still be stopping the tree
            report = self._owned.report
        return report if report is not None else ShutdownReport(None, False, (), 0.0)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ServerProcess pid={self.pid} url={self.url!r} state={self._state.value}>"

    # -- start-up --------------------------------------------------------------------------------

    def _start(self) -> None:
        """Launch attempts until one is healthy; on any failure stop what was started and raise."""
        config = self._config
        t0 = time.monotonic()
        deadline = t0 + config.startup_timeout
        try:
            for attempt in range(1, _PORT_RETRIES + 2):
                # 1. A port. A fixed one is checked first: if another server already listens there,
                #    our health probe would get *its* 200 and we would report a server that is not ours.
                if config.port is None:
                    self._port = _free_port(config.host)
                else:
                    self._port = config.port
                    if not _port_is_free(config.host, config.port):
                        raise ServerStartupError(
                            f"port {config.port} on {config.host} is already in use",
                            hint=_PORT_IN_USE_HINT,
                        )
                # 2. Spawn, keeping earlier attempts' logs beside the new one.
                if attempt > 1 and self.log_path.exists():
                    self.log_path.rename(self._run_dir / f"server.attempt{attempt - 1}.log")
                self._owned.tree = _spawn(config, self._port, self.log_path, attempt)
                _register(self._owned.tree, config, self._port, self.log_path)
                # 3. Wait for health, the process's death, or the deadline.
                try:
                    _wait_ready(
                        self._owned.tree, config, port=self._port, log_path=self.log_path, t0=t0, deadline=deadline
                    )
                except _PortClash as clash:
                    retry = config.port is None and attempt <= _PORT_RETRIES
                    self._owned.tree.stop(grace=0.0)
                    if not retry:
                        raise clash.error from None
                    continue
                self._state = ServerState.READY
                if config.on_phase is not None:
                    config.on_phase("ready", time.monotonic() - t0)
                return
        except BaseException:
            # Includes KeyboardInterrupt (Ctrl-C while waiting) and errors raised by on_phase.
            self._state = ServerState.FAILED
            self._owned.grace = min(self._owned.grace, _FAILED_START_GRACE_S)
            self._finalizer()
            raise


# ---------------------------------------------------------------------------------------------
# Launch configuration


@dataclass(frozen=True)
class _LaunchConfig:
    argv: tuple[str, ...]
    host: str
    port: int | None
    env: Mapping[str, str | None]
    log_dir: Path | None
    startup_timeout: float
    health_path: str
    on_phase: Callable[[str, float], None] | None
    grace: float
    pdeathsig: bool

    @classmethod
    def validated(
        cls,
        *,
        argv: Sequence[str],
        host: str,
        port: int | None,
        env: Mapping[str, str | None] | None,
        log_dir: str | os.PathLike[str] | None,
        startup_timeout: float,
        health_path: str,
        on_phase: Callable[[str, float], None] | None,
        grace: float,
        pdeathsig: bool,
    ) -> _LaunchConfig:
        """Check every option, raising TypeError/ValueError that names it."""
        if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence) or not argv:
            raise TypeError(
                "argv must be a non-empty list of strings, e.g. [sys.executable, '-m', 'rlgen.cpu_server', ...]"
            )
        if not all(isinstance(a, str) for a in argv):
            raise TypeError(f"argv must contain only strings, got {[type(a).__name__ for a in argv]}")
        for flag in ("--host", "--port"):
            if any(a == flag or a.startswith(flag + "=") for a in argv):
                raise ValueError(f"argv must not contain {flag}: pass host= / port= instead (rlgen appends them)")
        if not isinstance(host, str) or not host:
            raise ValueError(f"host must be a non-empty string, got {host!r}")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            raise ValueError(f"port must be None (pick a free one) or an int in 1..65535, got {port!r}")
        env_overrides = dict(env or {})
        for key, value in env_overrides.items():
            if not isinstance(key, str) or not (value is None or isinstance(value, str)):
                raise TypeError(f"env must map str to str (or None to unset), got {key!r}: {value!r}")
        if isinstance(startup_timeout, bool) or not isinstance(startup_timeout, (int, float)) or startup_timeout <= 0:
            raise ValueError(f"startup_timeout must be a positive number of seconds, got {startup_timeout!r}")
        _check_nonnegative("grace", grace)
        if not isinstance(health_path, str) or not health_path.startswith("/"):
            raise ValueError(f"health_path must start with '/', got {health_path!r}")
        if on_phase is not None and not callable(on_phase):
            raise TypeError("on_phase must be a callable (phase: str, elapsed_s: float) or None")
        if os.name != "posix":
            raise OSError("rlgen launches servers on Linux and macOS only (process groups and sessions are POSIX)")
        return cls(
            argv=tuple(argv),
            host=host,
            port=port,
            env=env_overrides,
            log_dir=Path(log_dir).expanduser() if log_dir is not None else None,
            startup_timeout=float(startup_timeout),
            health_path=health_path,
            on_phase=on_phase,
            grace=float(grace),
            pdeathsig=bool(pdeathsig),
        )


def _check_nonnegative(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")


def _new_run_dir(log_dir: Path | None) -> Path:
    """A fresh directory for one server's logs: `<cache>/servers/<time>-<owner pid>-<n>`."""
    if log_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        log_dir = _registry.servers_dir() / f"{stamp}-{os.getpid()}-{next(_run_counter)}"
    log_dir.mkdir(parents=True, exist_ok=True)
    return log_dir


# ---------------------------------------------------------------------------------------------
# Ports


def _free_port(host: str) -> int:
    """A port the OS reports free right now. Another process may take it before the server binds
    it (the server must bind it itself); the caller relaunches on "address already in use"."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_is_free(host: str, port: int) -> bool:
    """Can a server bind (host, port)? SO_REUSEADDR as servers set it, so a port in TIME_WAIT
    counts as free and only a live listener counts as taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _connect_host(host: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


# ---------------------------------------------------------------------------------------------
# Spawning


_SHIM = (
    "import ctypes, os, signal, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # 1 = PR_SET_PDEATHSIG\n"
    "    raise OSError(ctypes.get_errno(), 'prctl(PR_SET_PDEATHSIG) failed')\n"
    "if os.getppid() != int(sys.argv[1]):  # the launcher died before prctl: nobody will signal us\n"
    "    os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def _with_pdeathsig(cmd: list[str]) -> list[str]:
    """Prefix `cmd` so that it is SIGKILLed when the launching thread dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return cmd  # macOS & co. have no PR_SET_PDEATHSIG: the registry and reap() are the backstop
    setpriv = shutil.which("setpriv")
    if setpriv:
        return [setpriv, "--pdeathsig", "KILL", "--", *cmd]
    return [sys.executable, "-c", _SHIM, str(os.getpid()), *cmd]


def _spawn(config: _LaunchConfig, port: int, log_path: Path, attempt: int) -> _Tree:
    """Start one attempt: the child in its own session, its output to `log_path`."""
    cmd = [*config.argv, "--host", config.host, "--port", str(port)]
    env = dict(os.environ)
    # Unbuffered output, so log lines (and so phases) appear as they are printed, not at exit.
    env.setdefault("PYTHONUNBUFFERED", "1")
    for key, value in config.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    with open(log_path, "wb") as log:
        # One line, even for a `python -c` script, so that log readers can drop it by its prefix.
        command_line = shlex.join(cmd).replace("\n", "\\n")
        log.write(f"{_LOG_HEADER}attempt {attempt} on port {port}: {command_line}\n".encode())
        log.flush()
        popen_kwargs: dict[str, Any] = dict(
            stdin=subprocess.DEVNULL,
            stdout=log,  # a file, never a PIPE: a pipe nobody drains blocks the server when full
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # out of the kernel's process group: "Interrupt kernel" misses it
            close_fds=True,
        )
        if config.pdeathsig:
            proc = _popen_from_long_lived_thread(_with_pdeathsig(cmd), popen_kwargs)
        else:
            proc = subprocess.Popen(cmd, **popen_kwargs)
    # The child holds its own copy of the log descriptor; ours is closed by the `with`.
    return _Tree(proc)


def _register(tree: _Tree, config: _LaunchConfig, port: int, log_path: Path) -> None:
    """Write the registry record of a freshly spawned tree (removed again by `_Tree.stop`)."""
    proc = tree.proc
    owner_pid, owner_start = _registry.owner_identity()
    tree.has_record = True  # before writing: an interrupted write must still be cleaned up
    _registry.write_record(
        _registry.ServerRecord(
            pid=proc.pid,
            pgid=tree.pgid,
            create_time=tree.known.get(proc.pid, 0.0),
            port=port,
            host=config.host,
            owner_pid=owner_pid,
            owner_start_time=owner_start,
            argv=[*config.argv, "--host", config.host, "--port", str(port)],
            log_path=str(log_path),
            started_at=time.time(),
        )
    )


class _Spawner:
    """A daemon thread that lives as long as the interpreter and does the fork for callers that
    are not the main thread: the parent-death signal fires when the *forking thread* exits."""

    _lock = threading.Lock()
    _queue: SimpleQueue[tuple[list[str], dict[str, Any], Future[subprocess.Popen[bytes]]]] | None = None

    @classmethod
    def popen(cls, cmd: list[str], kwargs: dict[str, Any]) -> subprocess.Popen[bytes]:
        with cls._lock:
            if cls._queue is None:
                cls._queue = SimpleQueue()
                threading.Thread(target=cls._run, args=(cls._queue,), name="rlgen-spawner", daemon=True).start()
        future: Future[subprocess.Popen[bytes]] = Future()
        cls._queue.put((cmd, kwargs, future))
        return future.result()

    @staticmethod
    def _run(queue: SimpleQueue[tuple[list[str], dict[str, Any], Future[subprocess.Popen[bytes]]]]) -> None:
        while True:
            cmd, kwargs, future = queue.get()
            try:
                future.set_result(subprocess.Popen(cmd, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(exc)


def _popen_from_long_lived_thread(cmd: list[str], kwargs: dict[str, Any]) -> subprocess.Popen[bytes]:
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(cmd, **kwargs)
    return _Spawner.popen(cmd, kwargs)


# ---------------------------------------------------------------------------------------------
# Readiness


class _PortClash(Exception):
    """Internal: the attempt died of "address already in use" (retryable on a fresh port)."""

    def __init__(self, error: ServerStartupError) -> None:
        super().__init__(str(error))
        self.error = error


def _wait_ready(
    tree: _Tree, config: _LaunchConfig, *, port: int, log_path: Path, t0: float, deadline: float
) -> None:
    """Poll until the health probe answers 200 from *our* process; raise on death or timeout."""
    phases = _PhaseTracker(log_path)
    connect_host = _connect_host(config.host)
    while True:
        # 1. Dead? Checked first and every iteration, so a crash is reported within one interval.
        code = tree.proc.poll()
        if code is not None:
            error = _startup_error(f"the server {_describe_exit(code)} while starting", code, log_path)
            if _is_port_clash(log_path):
                raise _PortClash(error)
            raise error
        # 2. Phase, from the log lines printed since the last look.
        now = time.monotonic()
        phase = phases.update()
        tree.refresh()  # remember descendants while the server is alive to name them
        if config.on_phase is not None:
            config.on_phase(phase, now - t0)
        # 3. Out of time?
        if now >= deadline:
            hint = _match_hint(log_path) or _TIMEOUT_HINT
            raise ServerStartupTimeout(
                f"the server did not become healthy within startup_timeout={config.startup_timeout:g} s "
                f"(last phase: {phase})",
                exit_code=None,
                log_path=str(log_path),
                log_tail="\n".join(_read_tail_lines(log_path, _TAIL_LINES)),
                hint=hint,
            )
        # 4. Healthy? Probe only once our own tree listens on the port: if another process holds
        #    it, its answer (a 200 from a foreign server, or a socket that never answers) means
        #    nothing, and ours will soon exit with "address already in use".
        if _tree_listens_on(tree, port) is not False:
            probe_timeout = min(_PROBE_TIMEOUT_S, max(deadline - now, 0.1))
            if _probe(connect_host, port, config.health_path, timeout=probe_timeout) == 200:
                return
        time.sleep(max(0.0, min(_POLL_INTERVAL_S, deadline - time.monotonic())))


def _probe(host: str, port: int, path: str, *, timeout: float) -> int | None:
    """GET `path`; the status code, or None if nothing answered. http.client, not urllib: urllib
    honours http_proxy, and a proxy must never sit between us and a loopback server."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def _tree_listens_on(tree: _Tree, port: int) -> bool | None:
    """True if a process of the tree listens on `port`, False if none does, None if unknowable."""
    unknowable = False
    for pid in list(tree.known):  # the server itself first: SGLang's HTTP server runs there
        try:
            proc = psutil.Process(pid)
            # psutil >= 6 renamed connections() to net_connections().
            listing = proc.net_connections if hasattr(proc, "net_connections") else proc.connections
            conns = listing(kind="inet")
        except psutil.NoSuchProcess:
            continue
        except psutil.AccessDenied:
            unknowable = True
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns):
            return True
    return None if unknowable else False


class _PhaseTracker:
    """Reads the log incrementally and maps SGLang's start-up phrases to PHASES (forward only)."""

    def __init__(self, log_path: Path) -> None:
        self._path = log_path
        self._offset = 0
        self._partial = ""
        self.phase = PHASES[0]

    def update(self) -> str:
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return self.phase
        self._offset += len(chunk)
        text = self._partial + chunk.decode("utf-8", errors="replace")
        *lines, self._partial = re.split(r"[\r\n]", text)
        for line in lines:
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
    return "\n".join(line for line in text.split("\n") if not line.startswith(_LOG_HEADER))


def _read_tail_lines(log_path: Path, n: int) -> list[str]:
    # A progress bar redraws one line with \r: keep what a terminal would show (the last redraw).
    lines = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in _read_log_text(log_path).split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines[-n:] if n > 0 else []


def _match_hint(log_path: Path) -> str:
    """A one-line diagnosis from the known signatures, or ""."""
    text = _read_log_text(log_path)
    for pattern, hint in _HINTS:
        match = pattern.search(text)
        if match:
            return hint.format(*(g or "" for g in match.groups()))
    return ""


def _is_port_clash(log_path: Path) -> bool:
    return re.search(_PORT_IN_USE_PATTERN, _read_log_text(log_path), re.IGNORECASE) is not None


def _startup_error(message: str, code: int | None, log_path: Path) -> ServerStartupError:
    hint = _match_hint(log_path)
    if not hint and code is not None and code == -signal.SIGKILL:
        hint = "it was SIGKILLed, often by the host's out-of-memory killer: check free RAM and `dmesg`"
    return ServerStartupError(
        message,
        exit_code=code,
        log_path=str(log_path),
        log_tail="\n".join(_read_tail_lines(log_path, _TAIL_LINES)),
        hint=hint,
    )


def _is_exiting(pid: int) -> bool:
    """True once the process's main thread is gone: /proc shows it as a zombie while its other
    threads finish tearing down, before waitpid can report the exit."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is not running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# ---------------------------------------------------------------------------------------------
# Stopping


@dataclass
class _Tree:
    """One launched process and every descendant seen while it lived (pid -> create time)."""

    proc: subprocess.Popen[bytes]
    pgid: int = 0
    known: dict[int, float] = field(default_factory=dict)
    has_record: bool = False
    owner_pid: int = field(default_factory=os.getpid)
    report: ShutdownReport | None = None

    def __post_init__(self) -> None:
        # start_new_session makes the child a session and group leader: pgid == pid.
        self.pgid = self.proc.pid
        with contextlib.suppress(psutil.Error):  # already gone: poll() reports its exit
            self.known[self.proc.pid] = psutil.Process(self.proc.pid).create_time()

    def refresh(self) -> None:
        """Record the current descendants (psutil can only find them while their parent lives)."""
        if self.proc.poll() is not None:
            return
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    self.known.setdefault(child.pid, child.create_time())
        except psutil.Error:
            pass

    def stop(self, *, grace: float) -> ShutdownReport:
        """Stop the tree once; later calls return the first report."""
        if self.report is not None:
            return self.report
        if os.getpid() != self.owner_pid:
            # A forked copy of the owner (multiprocessing fork) must not stop the owner's server
            # when its copy of this object is collected.
            return ShutdownReport(None, False, (), 0.0)
        t0 = time.monotonic()
        self.refresh()
        escalated, leftovers = _terminate_tree(
            self.pgid, self.known.get(self.proc.pid), self.known, grace=grace, popen=self.proc
        )
        if self.has_record:
            _registry.remove_record(self.proc.pid)
        self.report = ShutdownReport(self.proc.poll(), escalated, leftovers, time.monotonic() - t0)
        return self.report


class _Owned:
    """The current tree of one ServerProcess: what its finalizer stops."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.tree: _Tree | None = None
        self.report: ShutdownReport | None = None
        # Held while stopping, so that a close() racing another one waits for the real report.
        self.lock = threading.Lock()

    def stop(self) -> None:
        with self.lock:
            if self.tree is not None:
                self.report = self.tree.stop(grace=self.grace)


def _terminate_tree(
    pgid: int,
    leader_create_time: float | None,
    known: Mapping[int, float],
    *,
    grace: float,
    popen: subprocess.Popen[bytes] | None = None,
) -> tuple[bool, tuple[int, ...]]:
    """SIGTERM the group and the known processes, wait `grace`, SIGKILL what is left, wait for it.

    Returns (escalated: SIGKILL was needed, pids still alive afterwards).
    """
    # The group may be signalled only while its id still means our group: if the leader is gone
    # and no member is left, the pid can be reused by an unrelated session leader.
    group = pgid if _group_is_ours(pgid, leader_create_time) else None
    # 1. Ask politely.
    _signal_all(group, known, signal.SIGTERM)
    # 2. Wait for the whole tree (not only the leader: its workers flush and exit too).
    deadline = time.monotonic() + grace
    while (remaining := _alive(group, known, popen)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not remaining:
        return False, ()
    # 3. Insist, then wait for the kernel to remove them (SIGKILL cannot be ignored).
    _signal_all(group, known, signal.SIGKILL)
    deadline = time.monotonic() + _KILL_WAIT_S
    while (remaining := _alive(group, known, popen)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return True, tuple(sorted(remaining))


def _group_is_ours(pgid: int, leader_create_time: float | None) -> bool:
    if pgid <= 1 or pgid == os.getpgrp():
        return False  # never our own group (or init's)
    try:
        leader = psutil.Process(pgid)
    except psutil.NoSuchProcess:
        return True  # leader gone; a pid stays reserved while its group has members
    if leader_create_time is None:
        return False
    try:
        return abs(leader.create_time() - leader_create_time) < 0.01
    except psutil.Error:
        return False


def _signal_all(group: int | None, known: Mapping[int, float], sig: signal.Signals) -> None:
    if group is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)
    me = os.getpid()
    for pid, ctime in known.items():
        # Only descendants that left the group (setsid): a second SIGTERM to a group member is not
        # harmless (uvicorn, SGLang's HTTP server, skips its graceful shutdown on a second signal).
        if pid == me or not _registry.process_alive(pid, ctime) or _pgid(pid) == group:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _alive(group: int | None, known: Mapping[int, float], popen: subprocess.Popen[bytes] | None) -> set[int]:
    """Pids of the tree still alive: known processes plus current members of the group."""
    alive = {pid for pid, ctime in known.items() if _registry.process_alive(pid, ctime)}
    if group is not None:
        alive |= _group_members(group)
    if popen is not None:
        # Our own child counts until waitpid says it exited (see _is_exiting: the zombie state
        # /proc shows comes earlier, while freeing a large KV cache can take a second); waitpid
        # also reaps it.
        alive.discard(popen.pid)
        if popen.poll() is None:
            alive.add(popen.pid)
    alive.discard(os.getpid())
    return alive


def _group_members(pgid: int) -> set[int]:
    members = set()
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                members.add(pid)
        except (OSError, psutil.Error):
            continue
    return members


# ---------------------------------------------------------------------------------------------
# Reaping servers whose owner died


def reap(*, dry_run: bool = False, grace: float = 5.0) -> list[dict[str, Any]]:
    """Stop servers whose owner process is gone, and delete stale records.

    A server is reaped when its owner pid is not alive, or is alive but is a different process
    (pid reuse: another create time). Servers of live owners, including this process, are never
    touched. Returns one dict per record acted on: the record plus `status` ("orphaned" or
    "gone"), `action` ("stopped", "record removed", or with dry_run "would stop" / "would remove
    record") and `leftover_pids`.
    """
    _check_nonnegative("grace", grace)
    found = []
    for record in _registry.read_records():
        status = _registry.record_status(record)
        if status in (_registry.RUNNING, _registry.OTHER_HOST):
            continue
        entry = {**record.to_dict(), "status": status, "leftover_pids": []}
        if dry_run:
            entry["action"] = "would stop" if status == _registry.ORPHANED else "would remove record"
            found.append(entry)
            continue
        owner_alive = _registry.process_alive(record.owner_pid, record.owner_start_time)
        if status == _registry.ORPHANED or not owner_alive:
            # Orphaned: stop it. Gone with a dead owner: its group may still hold grandchildren.
            known = {record.pid: record.create_time} if status == _registry.ORPHANED else {}
            _, leftovers = _terminate_tree(record.pgid, record.create_time, known, grace=grace)
            entry["leftover_pids"] = list(leftovers)
        entry["action"] = "stopped" if status == _registry.ORPHANED else "record removed"
        _registry.remove_record(record.pid)
        found.append(entry)
    return found


# ---------------------------------------------------------------------------------------------
# GPU memory


def wait_gpu_memory_released(pids: Sequence[int], *, timeout: float = 30.0, interval: float = 0.5) -> bool | None:
    """Poll until none of `pids` holds GPU memory: True once so, False on timeout, None if unknown.

    Uses pynvml if importable, else `nvidia-smi`; returns None at once on machines without either
    (CPU machines pay nothing). Inside a container the driver may report host pids, so a True
    there means "none of these pids is listed", which is the best this check can say.
    """
    deadline = time.monotonic() + timeout
    wanted = set(pids)
    while True:
        holders = _gpu_pids()
        if holders is None:
            return None
        if not wanted & holders:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def _gpu_pids() -> set[int] | None:
    """Pids of processes holding GPU memory, or None if that cannot be known here."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            try:
                pids: set[int] = set()
                for i in range(pynvml.nvmlDeviceGetCount()):
                    handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                    pids.update(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
                return pids
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - no driver / no GPU: fall through to nvidia-smi
            pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-compute-apps=pid", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {int(tok) for tok in out.split() if tok.isdigit()}
