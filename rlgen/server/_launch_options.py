"""The options of one `launch_server` call, checked before anything is started.

Owns: `LaunchOptions`, the frozen, normalised form of `launch_server`'s arguments, and their
validation (a TypeError/ValueError naming the option, or an OSError off POSIX), so that a bad
option fails at once and never as a half-started server.

Knows nothing about processes, ports in use, logs or HTTP: it only checks values.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ._process_tree import check_grace

__all__ = ["LaunchOptions"]


@dataclass(frozen=True)
class LaunchOptions:
    """Everything `launch_server` was given, checked and normalised."""

    argv: tuple[str, ...]
    host: str
    port: int | None
    env: Mapping[str, str | None]
    log_dir: Path | None
    startup_timeout: float
    health_path: str
    freeze_gc: bool
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
        freeze_gc: bool,
        on_phase: Callable[[str, float], None] | None,
        grace: float,
        pdeathsig: bool,
    ) -> LaunchOptions:
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
        check_grace(grace)
        if not isinstance(health_path, str) or not health_path.startswith("/"):
            raise ValueError(f"health_path must start with '/', got {health_path!r}")
        if not isinstance(freeze_gc, bool):
            raise TypeError(f"freeze_gc must be True or False, got {freeze_gc!r}")
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
            freeze_gc=freeze_gc,
            on_phase=on_phase,
            grace=float(grace),
            pdeathsig=bool(pdeathsig),
        )
