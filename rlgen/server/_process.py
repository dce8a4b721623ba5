"""Launching and watching a server process: the public launch API and `ServerProcess`.

Owns: one server (SGLang's `python -m sglang.launch_server ...` or rlgen's
`python -m rlgen.cpu_server ...`) from launch to close: the launch attempts, its port, its log
file and run directory, its registry record, its readiness and start-up phase reports, the
freeze of its garbage collector once ready, and the `ServerProcess` handle the Engine holds.
`reap`, `list_servers`, `PHASES`, `ShutdownReport` and `wait_gpu_memory_released` are re-exported
here from their homes.

Knows nothing about /generate payloads, sampling parameters, tokenizers or results: to this module
a server is an argv that binds `--host H --port N`, answers `GET /health_generate` with 200 once it
can generate, and may know `POST /freeze_gc`. Delegates: checking the options to
`server/_launch_options.py`; spawning, stopping and reaping the process tree (own session,
parent-death signal, SIGTERM/SIGKILL, `reap()`) to `server/_process_tree.py`; reading the log
(phases, tails, hints) to `server/_log.py`.

How a server is launched (each point answers a failure seen in the wild: hidden start-up errors,
port races, orphaned servers):

- **Readiness.** `GET /health_generate` every 0.5 s, with `proc.poll()` checked each time, so a
  crash is reported within one interval. The probe is only sent once a process of our own tree
  listens on the port: an auto-picked port can be taken by another process before the server binds
  it, and that process's answer must not pass for ours (the server then exits with "address
  already in use" and is relaunched on a fresh port, up to 3 times).
- **Garbage collector.** Once healthy (its own warm-up and our `/health_generate` behind it), the
  server gets `POST /freeze_gc` (SGLang's route; the API key in its argv goes with it): without it,
  SGLang's processes stall for tenths of a second in generation-2 collections. A server without the
  route, an error or no answer leaves an `[rlgen]` line in its log and the launch goes on. Not the
  sglang-router (`freeze_gc=False`), and never a server rlgen only attaches to.
- **Registry.** Each server writes `<cache>/servers/registry/<pid>.json` (see `server/_registry.py`),
  removed on close; `reap()` stops servers whose owner is gone.
- **Shutdown.** `close()` (also run by `weakref.finalize` at garbage collection and at interpreter
  exit; `__del__` is not used) stops the tree as `server/_process_tree.py` describes: SIGTERM to the
  group, `grace` seconds, SIGKILL, then a sweep of descendants that left the group.
"""

from __future__ import annotations

import contextlib
import enum
import http.client
import itertools
import os
import shlex
import shutil
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ..core._errors import ServerDiedError, ServerStartupError
from . import _log as _server_log
from . import _process_tree, _registry
from ._command import api_key_of, redacted
from ._launch_options import LaunchOptions
from ._log import PHASES
from ._process_tree import ProcessTree, ShutdownReport, reap, wait_gpu_memory_released

__all__ = [
    "PHASES",
    "ServerProcess",
    "ServerState",
    "ShutdownReport",
    "free_port",
    "launch_server",
    "list_servers",
    "reap",
    "wait_gpu_memory_released",
]

list_servers = _registry.list_servers

_POLL_INTERVAL_S = 0.5
_PROBE_TIMEOUT_S = 5.0  # one GET /health_generate; a dying server resets the connection at once
_FREEZE_GC_TIMEOUT_S = 10.0  # one POST /freeze_gc; no answer by then counts as none, and the launch goes on
_PORT_RETRIES = 3  # relaunches on a fresh port after "address already in use" (auto-picked ports only)
_FAILED_START_GRACE_S = 1.0  # a server that failed to start holds nothing worth a long goodbye
_run_counter = itertools.count(1)


class ServerState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"  # it never became ready (start-up error, timeout, Ctrl-C)
    CLOSED = "closed"


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
    freeze_gc: bool = True,
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
        freeze_gc: once healthy, `POST /freeze_gc` (SGLang's: its processes' objects so far are left
            out of every later garbage collection), with the argv's `--api-key` if it has one. A
            server that answers anything but 200, or nothing, is noted in its log and returned all
            the same. False for a server without the route (the sglang-router).
        on_phase: called about every 0.5 s while starting with (phase, seconds since launch);
            phase is one of PHASES and only moves forward.
        grace: seconds between SIGTERM and SIGKILL when the server is closed.
        _pdeathsig: private, for tests: False launches without the parent-death signal, as on a
            platform that lacks one.

    Raises:
        ServerStartupError: the server exited while starting (exit code, log tail, hint).
        ServerStartupTimeout: it did not become healthy within `startup_timeout`.
        KeyboardInterrupt: Ctrl-C while waiting; the server is stopped first.

    Call it from the main thread or a thread that outlives the server (see `server/_process_tree.py`: the
    parent-death signal follows the forking thread); from any other thread the spawn is handed to
    a long-lived thread of `server._process_tree`.
    """
    config = LaunchOptions.validated(
        argv=argv,
        host=host,
        port=port,
        env=env,
        log_dir=log_dir,
        startup_timeout=startup_timeout,
        health_path=health_path,
        freeze_gc=freeze_gc,
        on_phase=on_phase,
        grace=grace,
        pdeathsig=_pdeathsig,
    )
    server = ServerProcess(config)
    server._start()
    return server


# ---------------------------------------------------------------------------------------------
# The server object


class ServerProcess:
    """One server process tree this Python process launched and owns. Create it with `launch_server`.

    Use it as a context manager, or call `close()`; if neither happens, the tree is stopped when
    the object is garbage-collected or the interpreter exits.
    """

    def __init__(self, config: LaunchOptions) -> None:
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
        return tree is not None and tree.proc.poll() is None and not _process_tree.is_exiting(tree.proc.pid)

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
                tree.proc.wait(timeout=_process_tree.KILL_WAIT_S)
        code = self.exit_code
        raise ServerDiedError(
            f"the server (pid {self.pid}) {_server_log.describe_exit(code)}",
            exit_code=code,
            log_path=str(self.log_path),
            log_tail=self.log_tail(),
            hint=_server_log.died_hint(code, self.log_path),
        )

    def log_tail(self, n: int = _server_log.TAIL_LINES) -> str:
        """The last `n` lines of the server log (progress-bar redraws collapsed to their last state)."""
        return "\n".join(_server_log.read_tail_lines(self.log_path, n))

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
            _process_tree.check_grace(grace)
            self._owned.grace = grace
        self._finalizer()  # runs _Owned.stop at most once, whoever calls first
        if self._state is not ServerState.FAILED:
            self._state = ServerState.CLOSED
        with self._owned.lock:  # another thread's close() may still be stopping the tree
            report = self._owned.report
        return report if report is not None else ShutdownReport(None, False, (), 0.0)

    def release(self) -> None:
        """Stop owning the server: it keeps running after this object and this process are gone
        (close(), garbage collection and exit no longer stop it; its registry record stays). For a
        server launched without the parent-death signal, which something else will stop."""
        self._finalizer.detach()
        self._state = ServerState.CLOSED

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
                    self._port = free_port(config.host)
                else:
                    self._port = config.port
                    if not _port_is_free(config.host, config.port):
                        raise ServerStartupError(
                            f"port {config.port} on {config.host} is already in use",
                            hint=_server_log.PORT_IN_USE_HINT,
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
                if config.freeze_gc:
                    _freeze_gc(_connect_host(config.host), self._port, api_key=api_key_of(config.argv),
                               log_path=self.log_path)
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


class _Owned:
    """The current tree of one ServerProcess: what its finalizer stops."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.tree: ProcessTree | None = None
        self.report: ShutdownReport | None = None
        # Held while stopping, so that a close() racing another one waits for the real report.
        self.lock = threading.Lock()

    def stop(self) -> None:
        with self.lock:
            if self.tree is not None:
                self.report = self.tree.stop(grace=self.grace)


# ---------------------------------------------------------------------------------------------
# Run directory and ports


KEEP_RUN_DIRS = 50  # default log directories kept under <cache>/servers/ (newest first)


def _new_run_dir(log_dir: Path | None) -> Path:
    """A fresh directory for one server's logs: `<cache>/servers/<time>-<owner pid>-<n>`.

    Default directories beyond the newest KEEP_RUN_DIRS are deleted, except those whose server
    is still registered (running): a notebook that starts many engines does not fill the disk.
    """
    default = log_dir is None
    if log_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        log_dir = _registry.servers_dir() / f"{stamp}-{os.getpid()}-{next(_run_counter)}"
    log_dir.mkdir(parents=True, exist_ok=True)
    if default:
        _prune_run_dirs(_registry.servers_dir(), keep=KEEP_RUN_DIRS)
    return log_dir


def _prune_run_dirs(root: Path, *, keep: int) -> None:
    in_use = {Path(r.log_path).parent for r in _registry.read_records()}
    runs = sorted((d for d in root.iterdir() if d.is_dir() and d.name[:1].isdigit()), key=lambda d: d.name, reverse=True)
    for old in runs[keep:]:
        if old not in in_use:
            shutil.rmtree(old, ignore_errors=True)  # another process may be pruning too


def free_port(host: str) -> int:
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


def _spawn(config: LaunchOptions, port: int, log_path: Path, attempt: int) -> ProcessTree:
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
        command_line = shlex.join(redacted(cmd)).replace("\n", "\\n")
        log.write(f"{_server_log.LOG_HEADER}attempt {attempt} on port {port}: {command_line}\n".encode())
    # The child appends: a line rlgen adds later (`_note`) lands after the server's own, where a
    # child writing at its own offset would overwrite it.
    with open(log_path, "ab") as log:
        tree = _process_tree.spawn(cmd, env=env, stdout=log, pdeathsig=config.pdeathsig)
    # The child holds its own copy of the log descriptor; ours is closed by the `with`.
    return tree


def _note(log_path: Path, text: str) -> None:
    """Append one `[rlgen]` line to the server log (readers of the log skip them, as the header)."""
    with contextlib.suppress(OSError), open(log_path, "ab") as log:
        log.write(f"{_server_log.LOG_HEADER}{text}\n".encode())


def _register(tree: ProcessTree, config: LaunchOptions, port: int, log_path: Path) -> None:
    """Write the registry record of a freshly spawned tree (removed again by `ProcessTree.stop`)."""
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
            argv=redacted([*config.argv, "--host", config.host, "--port", str(port)]),
            log_path=str(log_path),
            started_at=time.time(),
        )
    )


# ---------------------------------------------------------------------------------------------
# Readiness


class _PortClash(Exception):
    """Internal: the attempt died of "address already in use" (retryable on a fresh port)."""

    def __init__(self, error: ServerStartupError) -> None:
        super().__init__(str(error))
        self.error = error


def _wait_ready(
    tree: ProcessTree, config: LaunchOptions, *, port: int, log_path: Path, t0: float, deadline: float
) -> None:
    """Poll until the health probe answers 200 from *our* process; raise on death or timeout."""
    phases = _server_log.PhaseTracker(log_path)
    connect_host = _connect_host(config.host)
    while True:
        # 1. Dead? Checked first and every iteration, so a crash is reported within one interval.
        code = tree.proc.poll()
        if code is not None:
            message = f"the server {_server_log.describe_exit(code)} while starting"
            error = _server_log.startup_error(message, code, log_path)
            if _server_log.is_port_clash(log_path):
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
            raise _server_log.timeout_error(
                f"the server did not become healthy within startup_timeout={config.startup_timeout:g} s "
                f"(last phase: {phase})",
                log_path,
            )
        # 4. Healthy? Probe only once our own tree listens on the port: if another process holds
        #    it, its answer (a 200 from a foreign server, or a socket that never answers) means
        #    nothing, and ours will soon exit with "address already in use".
        if tree.listens_on(port) is not False:
            probe_timeout = min(_PROBE_TIMEOUT_S, max(deadline - now, 0.1))
            if _probe(connect_host, port, config.health_path, timeout=probe_timeout) == 200:
                return
        time.sleep(max(0.0, min(_POLL_INTERVAL_S, deadline - time.monotonic())))


def _freeze_gc(host: str, port: int, *, api_key: str | None, log_path: Path) -> None:
    """`POST /freeze_gc` to a server that just became ready; never raises.

    SGLang's own advice ("Consider calling the freeze_gc API after sending a few warmup requests"),
    taken once its warm-up and our `/health_generate` are behind it: `gc.freeze()` in its tokenizer
    manager, scheduler and detokenizer leaves the objects made so far (the model's, the imports')
    out of every later collection. Without it the tokenizer manager's generation-2 collections
    walk all of them and stall the server for tenths of a second, every few seconds under load
    (docs/decisions.md). A server without the route (an older SGLang: 404 or 405), an error or no
    answer only costs that: a line in the log, and the launch goes on."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}
    status = _probe(host, port, "/freeze_gc", method="POST", headers=headers, timeout=_FREEZE_GC_TIMEOUT_S)
    if status != 200:
        answer = f"HTTP {status}" if status is not None else "no answer"
        _note(log_path, f"POST /freeze_gc: {answer}; the server's garbage collector is left unfrozen")


def _probe(host: str, port: int, path: str, *, timeout: float, method: str = "GET",
           headers: Mapping[str, str] | None = None) -> int | None:
    """`method` `path`; the status code, or None if nothing answered. http.client, not urllib: urllib
    honours http_proxy, and a proxy must never sit between us and a loopback server."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, headers=dict(headers or {}))
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
