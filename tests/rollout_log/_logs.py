"""Results to log without a server: a call's rows built from SGLang-shaped answers; and a moto S3
server to log them to."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from rlgen.rollouts import Rollouts, rollouts_from_responses


def answer(text: str, finish: str = "stop", *, start: int = 3) -> dict:
    ids = list(range(start, start + max(len(text), 1)))
    meta = {"id": "r", "finish_reason": {"type": finish, "matched": None}, "completion_tokens": len(ids),
            "output_token_logprobs": [[-0.5, i, None] for i in ids]}
    return {"text": text, "output_ids": ids, "meta_info": meta}


def call(completions: Sequence[Sequence[str]], *, rewards: Sequence[Sequence[float]] | None = None,
         finish: str = "stop", prompts: Sequence[str] | None = None) -> Rollouts:
    """One generate() call's result: prompt p ("question p", ids [10 + p, 11]) with the samples
    `completions[p]`, and a `reward` column when `rewards` is given."""
    n = len(completions[0])
    texts = list(prompts) if prompts is not None else [f"question {p}" for p in range(len(completions))]
    res = rollouts_from_responses([answer(c, finish) for group in completions for c in group],
                                  prompt_ids=[[10 + p, 11] for p in range(len(completions))], prompt_texts=texts,
                                  n=n, pad_token_id=0)
    if rewards is not None:
        res = res.with_columns({"reward": [r for group in rewards for r in group]})
    return res


def scored(completions: Sequence[Sequence[str]]) -> Rollouts:
    """A call scored by `says_yes` (1.0 when the completion is 'yes'), as a loop would log it."""
    return call(completions).add_rewards(says_yes, mode="inline", progress=False)


def says_yes(completion: str) -> float:
    return float(completion == "yes")


@contextlib.contextmanager
def moto_s3(argv: Sequence[str]) -> Iterator[dict[str, Any]]:
    """A moto S3 server started as `python <argv> <port>` with a bucket `runs`: s3fs's storage
    options for it; stopped on exit. `argv` e.g. ["-m", "moto.server", "-p"]."""
    from _cpu_server_process import free_port  # here: a writer process imports this module without tests/

    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    port = free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    server = subprocess.Popen([sys.executable, *argv, str(port)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.2)
        import boto3

        boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket="runs")
        yield {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": url, "region_name": "us-east-1"}}
    finally:
        server.terminate()
        server.wait(30)
