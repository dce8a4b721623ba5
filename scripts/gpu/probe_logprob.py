"""Diagnostic: does return_logprob change SGLang's greedy answer? (flushes the prefix cache between calls)"""
import json
import os
import urllib.request

import rlgen

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        raw = r.read()
    try:
        return json.loads(raw)
    except ValueError:
        return None


with rlgen.Engine(os.environ["RLGEN_TEST_MODEL"], backend="sglang", fast_start=True, progress=False) as eng:
    ids = eng.tokenizer.apply_chat_template(CAPITAL, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    g = {"temperature": 0.0, "max_new_tokens": 10}
    full = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "max_new_tokens": 10}
    cases = {
        "single": {"input_ids": ids, "sampling_params": g},
        "single+logprob": {"input_ids": ids, "sampling_params": g, "return_logprob": True},
        "single+logprob+top0": {"input_ids": ids, "sampling_params": g, "return_logprob": True, "top_logprobs_num": 0},
        "single+logprob start0": {"input_ids": ids, "sampling_params": g, "return_logprob": True, "logprob_start_len": 0},
        "batch1": {"input_ids": [ids], "sampling_params": g},
        "batch1+logprob": {"input_ids": [ids], "sampling_params": g, "return_logprob": True},
        "single+fullparams": {"input_ids": ids, "sampling_params": full},
        "batch1+rid": {"input_ids": [ids], "sampling_params": g, "rid": ["x1"]},
    }
    for name, body in cases.items():
        post(eng.url, "/flush_cache", {})
        out = post(eng.url, "/generate", body)
        out = out[0] if isinstance(out, list) else out
        print(f"{name:24s} {out['text']!r}", flush=True)
