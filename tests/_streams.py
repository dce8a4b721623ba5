"""A streamed `/generate` read on its own thread, for tests that act on a server while a request
runs (pause, abort, update): the HTTP status once the headers came, every chunk (parsed) until
[DONE]. Speaks only HTTP: works against the CPU backend and a real SGLang server alike."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any


class Stream:
    """`Stream(url, body)`: POST url/generate with `body` + stream, read on a daemon thread."""

    def __init__(self, url: str, body: dict[str, Any], *, timeout: float = 300) -> None:
        self.status: int | None = None
        self.chunks: list[dict[str, Any]] = []
        self._done = threading.Event()
        data = json.dumps({**body, "stream": True}).encode()
        self._request = urllib.request.Request(url + "/generate", data=data, method="POST",
                                               headers={"Content-Type": "application/json"})  # fmt: skip
        self._timeout = timeout
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            with urllib.request.urlopen(self._request, timeout=self._timeout) as response:
                self.status = response.status
                for raw in response:
                    line = raw.decode().strip()
                    if line.startswith("data:") and line[5:].strip() != "[DONE]":
                        self.chunks.append(json.loads(line[5:]))
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait_tokens(self, n: int, timeout: float = 60) -> None:
        """Until the latest chunk holds at least `n` output ids (fails if the stream ends first)."""
        deadline = time.monotonic() + timeout
        while not (self.chunks and len(self.chunks[-1].get("output_ids", [])) >= n):
            assert time.monotonic() < deadline and not self.done, f"no {n} tokens streamed"
            time.sleep(0.01)

    def final(self, timeout: float = 60) -> dict[str, Any]:
        """The last chunk, once the stream has ended."""
        assert self._done.wait(timeout), "the stream did not end"
        return self.chunks[-1]
