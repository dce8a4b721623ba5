"""SGLang's native HTTP API, as rlgen uses it.

Owns: the HTTP session to one server (SGLang or rlgen's CPU backend: same wire format), batched
`/generate` (plain and streamed over SSE), `/abort_request` and the control endpoints, fast JSON
(orjson) and the mapping of HTTP failures onto rlgen's exceptions. Knows nothing about processes
(a `on_connection_error` hook lets the owner say "the server died" instead) or about results.

All methods are coroutines that must run on rlgen's background loop (`rlgen.core._loop`): the aiohttp
session is bound to the loop it was created on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from ..core._errors import RequestError, RequestTimeout, ServerRequestError
from ..core._gc import gc_paused

__all__ = ["Client", "parse_prometheus"]

# SGLang's HTTP server (uvicorn) closes a keep-alive connection after 5 idle seconds
# (SGLANG_TIMEOUT_KEEP_ALIVE); aiohttp keeps idle connections for 15 s. A request sent 5-15 s after
# the last one could go out on a connection the server was closing and fail with "Server
# disconnected". So idle connections are dropped
# well before the server drops them, and a request the server dropped before answering is sent
# once more on a fresh connection.
KEEPALIVE_S = 2.0


class Client:
    """An async client for one server's native API.

    `one_prompt_per_request` tells the generate core which request shape the server takes: False,
    batched requests (a list of prompts, a list of rids); True (a router, `rlgen.client._router`), one
    prompt per request with one rid.

    Args:
        url: base URL, e.g. "http://127.0.0.1:30000".
        request_timeout: seconds a single request may take before RequestTimeout (None: no limit;
            /generate requests are long by nature, and Ctrl-C aborts them).
        on_connection_error: called when the server cannot be reached; may raise a better error
            (e.g. ServerDiedError with the log tail when the owned process is gone).
    """

    one_prompt_per_request = False

    def __init__(
        self,
        url: str,
        *,
        request_timeout: float | None = None,
        on_connection_error: Callable[[], None] | None = None,
        api_key: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        # Sent as `Authorization: Bearer <key>` on every request, as SGLang's --api-key expects.
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.request_timeout = request_timeout
        self._on_connection_error = on_connection_error
        self._session: Any = None  # aiohttp.ClientSession, created on the loop on first use

    # -- session ---------------------------------------------------------------------------------
    def _get_session(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            # No connection cap: rlgen bounds concurrency itself (chunks in flight), and a cap here
            # would silently serialise requests; no total timeout: generation is long by nature.
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.request_timeout, sock_connect=10),
                json_serialize=lambda obj: orjson.dumps(obj).decode(),
                headers=self._headers,
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    # -- generic requests ------------------------------------------------------------------------
    async def request(self, method: str, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        """One request; returns the decoded JSON (or text) body, raises on an error status."""
        import aiohttp

        session = self._get_session()
        kwargs: dict[str, Any] = {}
        if body is not None:
            kwargs["data"] = orjson.dumps(body)
            kwargs["headers"] = {"Content-Type": "application/json"}
        if timeout is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout, sock_connect=10)
        try:
            async with await _send(session, method, self.url + path, **kwargs) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    raise _status_error(path, resp.status, raw)
                return _decode(raw)
        except asyncio.TimeoutError:
            raise RequestTimeout(f"{method} {path} got no answer in time; raise `request_timeout=`") from None
        except aiohttp.ClientConnectionError as err:
            self._connection_failed()
            raise RequestError(f"cannot reach the server at {self.url} ({err}); is it running?") from err
        except aiohttp.ClientPayloadError as err:
            self._connection_failed()
            raise RequestError(f"{method} {path}: the server at {self.url} broke off its answer ({err})") from err

    async def get(self, path: str, **kwargs: Any) -> Any:
        return await self.request("GET", path, **kwargs)

    async def get_info(self, which: str, **kwargs: Any) -> Any:
        """GET /server_info or /model_info (`which`: "server" or "model"), or the older
        /get_server_info, /get_model_info on a server without the new names (SGLang < 0.5.17)."""
        try:
            return await self.get(f"/{which}_info", **kwargs)
        except ServerRequestError as err:
            if err.status != 404:
                raise
            return await self.get(f"/get_{which}_info", **kwargs)

    async def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return await self.request("POST", path, body if body is not None else {}, **kwargs)

    def _connection_failed(self) -> None:
        if self._on_connection_error is not None:
            self._on_connection_error()

    # -- generation ------------------------------------------------------------------------------
    async def generate(self, payload: dict[str, Any]) -> Any:
        """POST /generate; returns SGLang's response (a dict for one prompt, a list for a batch)."""
        return await self.post("/generate", payload)

    async def generate_stream(self, payload: dict[str, Any]) -> AsyncIterator[Any]:
        """POST /generate with stream=True; yields each decoded SSE chunk (SGLang's shape)."""
        import aiohttp

        session = self._get_session()
        try:
            async with await _send(
                session,
                "POST",
                self.url + "/generate",
                data=orjson.dumps({**payload, "stream": True}),
                headers={"Content-Type": "application/json"},
            ) as resp:
                if resp.status >= 400:
                    raise _status_error("/generate", resp.status, await resp.read())
                async for line in resp.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    chunk = orjson.loads(data)
                    if isinstance(chunk, dict) and "error" in chunk and "meta_info" not in chunk:
                        raise ServerRequestError(f"/generate stream failed: {chunk['error']}", status=_event_status(chunk),
                                                 body=str(chunk))
                    yield chunk
        except asyncio.TimeoutError:
            raise RequestTimeout("streamed /generate got no answer in time; raise `request_timeout=`") from None
        except aiohttp.ClientConnectionError as err:
            self._connection_failed()
            raise RequestError(f"cannot reach the server at {self.url} ({err}); is it running?") from err
        except aiohttp.ClientPayloadError as err:
            # The connection broke mid-stream: e.g. behind a router, the worker serving it died (a
            # router cannot retry a stream it has started to pass on).
            self._connection_failed()
            raise RequestError(f"the stream from {self.url} broke off before it finished ({err})") from err

    async def abort(self, rids: list[str]) -> None:
        """Abort requests by rid (SGLang 0.5.17's /abort_request takes one rid, or everything)."""
        await asyncio.gather(*(self.post("/abort_request", {"rid": rid}, timeout=30) for rid in rids))


async def _send(session: Any, method: str, url: str, **kwargs: Any) -> Any:
    """`session.request(...)`'s response; sent once more if the server closed the connection
    before answering (a keep-alive connection it was dropping: it never saw the request, so a
    /generate is not run twice). A server that is really gone fails the second try as well."""
    import aiohttp

    try:
        return await session.request(method, url, **kwargs)
    except aiohttp.ServerDisconnectedError:
        return await session.request(method, url, **kwargs)


def _event_status(chunk: dict[str, Any]) -> int:
    """The status of a stream's error event: its `code` (SGLang 0.5.17 writes the error's
    status_code there: 499 for a request a pause's abort caught before the scheduler), else 500."""
    error = chunk.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600 else 500


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    # A /generate body of 256 samples x 64 tokens (500 KB) is already some 70,000 small lists; the
    # cyclic GC would scan them over and over while they are created. They hold no cycles.
    with gc_paused() if len(raw) > (1 << 16) else contextlib.nullcontext():
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw.decode(errors="replace")


def _status_error(path: str, status: int, raw: bytes) -> ServerRequestError:
    body = _decode(raw)
    message = body
    if isinstance(body, dict):
        err = body.get("error")
        message = err.get("message", err) if isinstance(err, dict) else (err or body.get("message") or body)
    text = str(message)
    if status == 401:
        text += " (the server requires an API key: Engine.connect(url, api_key=...))"
    return ServerRequestError(f"{path} failed with HTTP {status}: {text}", status=status, body=text)


def parse_prometheus(text: str) -> list[dict[str, Any]]:
    """Rows of SGLang's /metrics (Prometheus text format): name, labels (as written), value."""
    rows = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        try:
            rows.append({"name": name, "labels": labels.rstrip("}"), "value": float(value)})
        except ValueError:
            continue
    return rows
