"""The exception tree: every error rlgen raises on purpose is one of these.

    RlgenError
    ├── ModelError                  a model could not be resolved or prepared
    ├── WeightsError                weights refused before anything was sent (names, shapes, device)
    ├── AdapterError                a LoRA adapter refused (LoRA not served, rank, modules, unknown name)
    ├── LogError                    a rollout log refused or could not read something (path, part, step, version)
    ├── EngineError                 the server an Engine owns or talks to
    │   ├── ServerStartupError      the server failed while starting (exit code, log tail, hint)
    │   │   └── ServerStartupTimeout    ... or did not become healthy in `startup_timeout`
    │   ├── ServerDiedError         the server died after it was ready
    │   └── EngineClosedError       the Engine was used after close()
    └── RequestError                one HTTP request to the server
        ├── ServerRequestError      the server answered with an error status (HTTP 4xx/5xx)
        ├── RequestTimeout          no answer within the client's timeout
        └── WorkerRequestError      behind a router: a request sent to every worker failed on some

Ctrl-C is not an rlgen error: it raises KeyboardInterrupt as everywhere in Python (generate()
first aborts its requests on the server and keeps the finished samples in `eng.last_result`).

Messages say what to do next. Exceptions carry their context as attributes, so that a notebook
user can inspect `err.log_tail` or `err.prompt_index` without parsing text.
"""

from __future__ import annotations

__all__ = [
    "AdapterError",
    "EngineClosedError",
    "EngineError",
    "LogError",
    "ModelError",
    "RequestError",
    "RequestTimeout",
    "RlgenError",
    "ServerDiedError",
    "ServerRequestError",
    "ServerStartupError",
    "ServerStartupTimeout",
    "WeightsError",
    "WorkerRequestError",
]


class RlgenError(Exception):
    """Base of every error rlgen raises on purpose."""


class ModelError(RlgenError):
    """A model path is missing or invalid, or the default model could not be prepared."""


class WeightsError(RlgenError, ValueError):
    """`Engine.update_weights` refused the weights before sending anything: names or shapes the
    served model does not have, LoRA weights not merged, tensors on a device the server cannot
    read, or a server on another machine. The server's weights are unchanged. Also a ValueError."""


class AdapterError(RlgenError, ValueError):
    """A LoRA adapter was refused: the server serves no adapters (start the Engine with `lora=`),
    its rank or modules are beyond what the server was started for, an adapter name is not loaded,
    or the server refused the load (its message included). Also a ValueError."""


class LogError(RlgenError, ValueError):
    """A rollout log (`rlgen.RolloutLog`) refused or could not read something: a path that is not a
    log, a step logged twice under one name, a reward version name taken by another function, a
    framework's folder in a format this version does not know, a part that cannot be read. Nothing
    in the log was changed. Also a ValueError.

    Attributes:
        path: the file or folder concerned, where there is one.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        super().__init__(message)


class EngineError(RlgenError):
    """Something went wrong with the server process an Engine owns or talks to."""


class _ServerFailure(EngineError):
    """A server process failed; carries what a user needs to see why (shared by the two below).

    Attributes:
        exit_code: the process's exit code, or None if it was still running.
        log_path: the server log file, if any.
        log_tail: the last lines of that log.
        hint: a one-line diagnosis matched from the log, or "".
    """

    def __init__(
        self,
        message: str,
        *,
        exit_code: int | None = None,
        log_path: str | None = None,
        log_tail: str = "",
        hint: str = "",
    ) -> None:
        self.exit_code = exit_code
        self.log_path = log_path
        self.log_tail = log_tail
        self.hint = hint
        parts = [message]
        if hint:
            parts.append(f"hint: {hint}")
        if log_path:
            parts.append(f"see log at {log_path}")
        if log_tail:
            parts.append("last log lines:\n" + log_tail)
        super().__init__("\n".join(parts))


class ServerStartupError(_ServerFailure):
    """The server exited or failed while starting (exit code, log tail, hint attached)."""


class ServerStartupTimeout(ServerStartupError):
    """The server did not become healthy within `startup_timeout` seconds."""


class ServerDiedError(_ServerFailure):
    """The server process died after it was ready (exit code and log tail attached)."""


class EngineClosedError(EngineError):
    """The Engine was used after `close()`; create a new Engine."""


class RequestError(RlgenError):
    """One request to the server failed.

    Attributes:
        prompt_index: index of the first prompt of the failing request in the user's input, if known.
    """

    def __init__(self, message: str, *, prompt_index: int | None = None) -> None:
        self.prompt_index = prompt_index
        super().__init__(message)


class ServerRequestError(RequestError):
    """The server answered with an error status.

    Attributes:
        status: the HTTP status code.
        body: the server's error text.
    """

    def __init__(self, message: str, *, status: int, body: str = "", prompt_index: int | None = None) -> None:
        self.status = status
        self.body = body
        super().__init__(message, prompt_index=prompt_index)


class RequestTimeout(RequestError):
    """The server did not answer within the client's timeout (raise `request_timeout=`)."""



class WorkerRequestError(RequestError):
    """Behind a router: a control request that rlgen sends to every worker (new weights, memory,
    cache, abort) failed on some of them. Every worker was tried; the ones in `succeeded` did it,
    so the workers may now differ (e.g. serve different weights) until the call is repeated.

    Attributes:
        failures: worker URL -> what went wrong there (the worker's answer, or why it could not be reached).
        statuses: worker URL -> the HTTP status it answered, or None where it could not be reached.
        succeeded: the URLs of the workers where the request worked.
    """

    def __init__(self, message: str, *, failures: dict[str, str], statuses: dict[str, int | None],
                 succeeded: list[str]) -> None:
        self.failures = failures
        self.statuses = statuses
        self.succeeded = succeeded
        super().__init__(message)
