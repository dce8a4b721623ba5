"""The server the conformance suite talks to.

One suite, two targets, chosen by environment:
  RLGEN_CONFORMANCE_URL=http://host:port   a server that is already running (real SGLang on the GPU machine)
  RLGEN_CONFORMANCE_CMD="... {model} ..."  a launch command; {model} is filled in, --host/--port appended
  (neither)                               rlgen's CPU backend on the test model, launched here
The suite speaks raw HTTP (stdlib only), so it checks the wire format and nothing of rlgen's client.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass
class Target:
    url: str
    backend: str  # "sglang" or "cpu"
    model_path: str
    tokenizer: Any

    # ---- raw HTTP helpers --------------------------------------------------------------------
    def get(self, path: str, *, timeout: float = 60) -> tuple[int, Any]:
        return self._request("GET", path, None, timeout)

    def post(self, path: str, body: dict | None = None, *, timeout: float = 300) -> tuple[int, Any]:
        return self._request("POST", path, body, timeout)

    def generate(self, body: dict, *, timeout: float = 300) -> Any:
        status, data = self.post("/generate", body, timeout=timeout)
        assert status == 200, f"/generate answered {status}: {data}"
        return data

    def stream(self, body: dict, *, timeout: float = 300) -> list[str]:
        """POST /generate with stream=True; return the raw `data:` payloads in order."""
        req = urllib.request.Request(
            self.url + "/generate",
            data=json.dumps({**body, "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        events = []
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            assert resp.status == 200
            for raw in resp:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("data:"):
                    events.append(line[len("data:"):].strip())
        return events

    def _request(self, method: str, path: str, body: dict | None, timeout: float) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, _decode(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, _decode(err.read())

    def chat_ids(self, content: str) -> list[int]:
        out = self.tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                                 add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(out["input_ids"])


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def _wait_healthy(url: str, deadline: float) -> None:
    """Wait for a server someone else started (URL mode)."""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health_generate", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server at {url} not healthy in time")


@pytest.fixture(scope="session")
def target(model_path: str) -> Iterator[Target]:
    from transformers import AutoTokenizer

    from rlgen.server._process import launch_server

    url = os.environ.get("RLGEN_CONFORMANCE_URL")
    server = None
    if url:
        url = url.rstrip("/")
        _wait_healthy(url, time.monotonic() + 600)
        with urllib.request.urlopen(url + "/model_info", timeout=30) as resp:
            info = json.loads(resp.read())
        served_path = info.get("tokenizer_path") or info["model_path"]
        backend = os.environ.get("RLGEN_CONFORMANCE_BACKEND", "sglang")
    else:
        cmd = os.environ.get("RLGEN_CONFORMANCE_CMD")
        argv = (shlex.split(cmd.format(model=model_path)) if cmd else
                [sys.executable, "-m", "rlgen.cpu_server", "--model-path", model_path])
        backend = "sglang" if "sglang" in " ".join(argv) else "cpu"
        # rlgen's own process ownership: free port, health wait, log file, nothing left behind
        server = launch_server(argv, startup_timeout=float(os.environ.get("RLGEN_CONFORMANCE_STARTUP", "600")))
        url = server.url
        served_path = model_path
    tokenizer = AutoTokenizer.from_pretrained(served_path)
    try:
        yield Target(url=url, backend=backend, model_path=served_path, tokenizer=tokenizer)
    finally:
        if server is not None:
            server.close()
