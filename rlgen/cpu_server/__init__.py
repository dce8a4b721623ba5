"""The CPU backend: a real server process that speaks SGLang 0.5.x's native HTTP API.

Owns: a real server process that serves a transformers model on the CPU with SGLang's HTTP API, for
machines without a GPU and the test suite. Knows nothing about the rest of rlgen: it imports no
other rlgen package, and rlgen talks to it over HTTP exactly as to SGLang.

It is started exactly like SGLang:

    python -m rlgen.cpu_server --model-path PATH --port N [--host 127.0.0.1] [SGLang flags...]

It runs a transformers causal LM in float32 on the CPU, and batches every request it holds through
one left-padded batch with a KV cache; prompts reuse the cached keys and values of earlier prompts
that share their prefix. Machines without a GPU (and the test suite) use it in place of
`python -m sglang.launch_server`.

Modules:
    __main__       command line, startup phases and their log lines, binding, shutdown
    _app           aiohttp routes and handlers, the state they share, /generate's flow, control endpoints
    _request       request parsing and validation: SGLang's normalization, verify rules, error messages
    _response      SGLang's response, logprob and error bodies; results from the scheduler thread
    _fields        every /generate field and sampling key with SGLang's default and what is done with it
    _jobs          Job, SamplingParams, SeqOutput: the data passed between the routes and the runner
    _pause         SGLang's pause gate: requests held while paused, aborts of those not yet scheduled (499)
    _runner        the scheduler thread: inbox, admission, aborts, control calls, prefill and decode
                   steps, prefix-cache reuse, memory release and resume, the scheduler's pause
                   (in_place, retract)
    _model         the transformers model: loading, forward pass, LM head, weight reload, freeing
    _batch         the running batch's tensors (left-padded, growing KV cache) and their surgery
    _sampling      penalties, token choice (greedy, top-k/top-p/min-p, seeds), logprobs, top-k lists
    _outputs       stop conditions, output text and SeqOutput snapshots
    _prefix_cache  the KV of earlier prompts, for reuse (SGLang's radix cache, as a bounded list),
                   never shared across LoRA adapters
    _lora_flags    SGLang's LoRA flags and their checks, LoraRef
    _lora_adapter  a PEFT adapter read and checked (SGLang's rules and messages), its weights and scaling
    _lora          LoRA hooks on the model's linear layers, the loaded adapters, per-row adapters
    _lora_api      SGLang's LoRA registry and endpoints, a /generate's lora_path to adapter ids
    _faults        fault modes driven by RLGEN_CPU_* environment variables, for lifecycle tests
"""

from __future__ import annotations
