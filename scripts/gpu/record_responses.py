"""Record raw SGLang /generate responses (for docs and for offline client tests).

usage: python record_responses.py URL OUT.json
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request


def call(url: str, path: str, body: dict | None) -> dict:
    try:
        return _call(url, path, body)
    except OSError as err:  # the server died or dropped the connection
        return {"path": path, "request": body, "status": None, "response": repr(err)}


def _call(url: str, path: str, body: dict | None) -> dict:
    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    try:
        data = json.loads(raw)
    except ValueError:
        data = raw.decode(errors="replace")
    return {"path": path, "request": body, "status": status, "response": data}


def main() -> None:
    url, out = sys.argv[1].rstrip("/"), sys.argv[2]
    g = {"temperature": 0.0}
    cases = [
        ("/get_model_info", None),
        ("/get_server_info", None),
        ("/generate", {"text": "The capital of France is", "sampling_params": {**g, "max_new_tokens": 8}}),
        ("/generate", {"text": ["Hi", "Name a colour."], "return_logprob": True, "top_logprobs_num": 2,
                       "logprob_start_len": 0, "sampling_params": {**g, "max_new_tokens": 4}}),
        ("/generate", {"text": "Once", "sampling_params": {"temperature": 1.0, "max_new_tokens": 3, "n": 2}}),
        ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": -1}}),
        ("/generate", {"text": "Hi", "sampling_params": {"n": 0, "max_new_tokens": 2}}),
        ("/generate", {"text": [], "sampling_params": {"max_new_tokens": 2}}),
        ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2, "bogus_key": 1}}),
        ("/flush_cache", {}),
        ("/update_weights_from_disk", {"model_path": "/nonexistent"}),
    ]
    records = [call(url, path, body) for path, body in cases]
    # one streamed request, raw SSE lines
    req = urllib.request.Request(url + "/generate", data=json.dumps({"text": "Hello", "stream": True, "return_logprob": True,
                                 "sampling_params": {**g, "max_new_tokens": 3, "ignore_eos": True}}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=120) as resp:
        records.append({"path": "/generate (stream)", "status": resp.status,
                        "response": [line.decode().rstrip() for line in resp if line.strip()]})
    # Last, since it kills SGLang 0.5.17 (device-side assert in the attention kernel, seen 2026-11-30):
    records.append(call(url, "/generate", {"input_ids": [10**7], "sampling_params": {"max_new_tokens": 2}}))
    with open(out, "w") as fh:
        json.dump(records, fh, indent=1)
    for r in records:
        print(r["path"], r["status"], json.dumps(r["response"])[:300])


if __name__ == "__main__":
    main()
