"""`python -m rlgen.cpu_server`: command line and startup phases of the CPU backend.

Owns: argument parsing (SGLang's flag names; unknown flags are warned about and ignored, so a
launcher can pass SGLang arguments through; the LoRA flags and their checks come from
`_lora_flags`, and a failed check ends the process before anything loads, as in SGLang), the
startup sequence and its SGLang-like log lines
(a launcher shows them as progress), binding the port, the warm-up, and shutdown on SIGTERM/SIGINT.

Startup: "Load weight begin" → load → "Load weight end" → "KV Cache is allocated" → bind
("Uvicorn running on ...", kept verbatim for launchers that look for it) → a 1-token warm-up
generation → "The server is fired up and ready to roll!". /health answers 503 until then.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from rlgen.cpu_server import _faults
from rlgen.cpu_server._lora_flags import add_lora_arguments, check_lora_args, lora_server_args

if TYPE_CHECKING:
    from rlgen.cpu_server._app import BackendState
    from rlgen.cpu_server._runner import Runner

# torch, transformers and aiohttp load only after "Load weight begin" (see main()).

logger = logging.getLogger("rlgen.cpu_server")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m rlgen.cpu_server",
        description="A CPU stand-in for `python -m sglang.launch_server` (SGLang's native HTTP API).",
        allow_abbrev=False,  # an unknown SGLang flag must never be read as an abbreviation of ours
    )
    parser.add_argument("--model-path", required=True, help="HF checkout of a causal LM")
    parser.add_argument("--tokenizer-path", default=None, help="defaults to --model-path")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--random-seed", type=int, default=None)
    parser.add_argument("--context-length", type=int, default=None)
    parser.add_argument("--max-running-requests", type=int, default=None)
    parser.add_argument("--max-prefill-tokens", type=int, default=8192)
    parser.add_argument("--disable-radix-cache", action="store_true", help="no prefix cache: every prompt is prefilled whole")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--enable-metrics", action="store_true", help="serve /metrics")
    parser.add_argument("--api-key", default=None,
                        help="require `Authorization: Bearer <key>` on every route but /health* and /metrics, as SGLang")
    # Accepted for SGLang compatibility; they change nothing on the CPU (/release_memory_occupation
    # frees memory with or without --enable-memory-saver).
    parser.add_argument("--enable-memory-saver", action="store_true")
    parser.add_argument("--mem-fraction-static", type=float, default=None)
    parser.add_argument("--disable-cuda-graph", action="store_true")
    parser.add_argument("--disable-prefill-cuda-graph", action="store_true")
    parser.add_argument("--skip-server-warmup", action="store_true")
    parser.add_argument("--cpu-threads", type=int, default=None, help="torch threads (default: 1 on up to 2 cores, else cores - 1)")
    add_lora_arguments(parser)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        print(f"WARNING: rlgen.cpu_server ignores unsupported arguments: {' '.join(unknown)}", flush=True)
    check_lora_args(args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _configure_logging(args.log_level)
    _faults.on_process_start()
    # The first progress line comes before the heavy imports: importing torch and transformers
    # takes seconds, and the start-up fault modes must act without waiting for them.
    logger.info(f"Load weight begin. avail mem={_avail_gb():.2f} GB")
    _faults.on_load_begin()
    runner = _load_runner(args)
    weight_gb = sum(p.numel() * p.element_size() for p in runner.model.parameters()) / 2**30
    logger.info(
        f"Load weight end. type={runner.model_type}, dtype=torch.float32, "
        f"avail mem={_avail_gb():.2f} GB, mem usage={weight_gb:.2f} GB."
    )
    _log_kv_cache(runner)
    _faults.sleep_before_bind()
    runner.start()
    return asyncio.run(_serve(args, runner))


def _load_runner(args: argparse.Namespace) -> Runner:
    # Idle OpenMP threads must sleep, not spin: a spinning pool is many times slower when the
    # cores are shared with a notebook, a test run or other servers. Set before torch loads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    import transformers

    from rlgen.cpu_server._lora import LoraSpec
    from rlgen.cpu_server._model import default_num_threads
    from rlgen.cpu_server._runner import DEFAULT_PREFIX_CACHE_BYTES, Runner

    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    torch.set_num_threads(args.cpu_threads or default_num_threads())
    return Runner(
        args.model_path,
        context_length=args.context_length,
        max_running_requests=args.max_running_requests or 64,
        max_prefill_tokens=args.max_prefill_tokens,
        random_seed=args.random_seed,
        prefix_cache_bytes=0 if args.disable_radix_cache else DEFAULT_PREFIX_CACHE_BYTES,
        lora=LoraSpec(args.max_lora_rank, args.lora_target_modules, args.max_loras_per_batch, list(args.lora_paths))
        if args.enable_lora else None,
    )


async def _serve(args: argparse.Namespace, runner: Runner) -> int:
    from aiohttp import web
    from transformers import AutoTokenizer

    from rlgen.cpu_server._app import BackendState, build_app
    from rlgen.cpu_server._lora_api import LoraApi

    tokenizer_path = args.tokenizer_path or args.model_path
    state = BackendState(
        runner=runner,
        tokenizer=AutoTokenizer.from_pretrained(tokenizer_path),
        server_args=_server_args(args, runner),
        model_path=args.model_path,
        tokenizer_path=tokenizer_path,
        served_model_name=args.served_model_name or args.model_path,
        lora=LoraApi(runner, enabled=bool(args.enable_lora), max_loaded_loras=args.max_loaded_loras,
                     initial=list(args.lora_paths or []) if args.enable_lora else []),
    )
    # A short shutdown_timeout: on SIGTERM, open streams must not hold the exit for a minute.
    web_runner = web.AppRunner(build_app(state, api_key=args.api_key), access_log=None, handle_signals=False,
                               shutdown_timeout=2.0)
    await web_runner.setup()
    try:
        await web.TCPSite(web_runner, args.host, args.port).start()
    except OSError as e:
        reason = "address already in use" if e.errno == errno.EADDRINUSE else str(e)
        print(f"ERROR: error while attempting to bind on address ({args.host!r}, {args.port}): {reason}",
              file=sys.stderr, flush=True)  # fmt: skip
        await web_runner.cleanup()
        return 1
    logger.info(f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if "ignore_sigterm" not in _faults.active():  # the fault keeps SIG_IGN in place
        loop.add_signal_handler(signal.SIGTERM, stop.set)

    if not args.skip_server_warmup:
        await _warm_up(state)
    state.ready = True
    logger.info("The server is fired up and ready to roll!")
    await stop.wait()
    logger.info("Shutting down.")
    await web_runner.cleanup()
    return 0


async def _warm_up(state: BackendState) -> None:
    """One greedy 1-token generation through the whole pipeline, like SGLang's warm-up request."""
    from rlgen.cpu_server._jobs import Job, SamplingParams

    started = time.monotonic()
    prompt = state.tokenizer("The capital city of France is")["input_ids"]
    job = Job(rid="WARMUP", input_ids=list(prompt), params=SamplingParams(max_new_tokens=1, temperature=0.0),
              sink=lambda _: None)  # fmt: skip
    (out,) = await state.run_jobs([job])
    if out.error is not None:
        raise RuntimeError(f"warm-up generation failed: {out.error[1]}")
    logger.info(f"Warm-up generation done in {time.monotonic() - started:.2f}s.")


def _server_args(args: argparse.Namespace, runner: Runner) -> dict[str, Any]:
    """The ServerArgs-like part of /server_info (SGLang's field names)."""
    return {
        "model_path": args.model_path,
        "tokenizer_path": args.tokenizer_path or args.model_path,
        "host": args.host,
        "port": args.port,
        "served_model_name": args.served_model_name or args.model_path,
        "random_seed": args.random_seed,
        "context_length": runner.context_length,
        "max_running_requests": runner.max_running_requests,
        "max_prefill_tokens": runner.max_prefill_tokens,
        "disable_radix_cache": args.disable_radix_cache,
        "enable_memory_saver": args.enable_memory_saver,
        "mem_fraction_static": args.mem_fraction_static,
        "disable_cuda_graph": args.disable_cuda_graph,
        "enable_metrics": args.enable_metrics,
        "log_level": args.log_level,
        "device": "cpu",
        "dtype": "float32",
        "skip_server_warmup": args.skip_server_warmup,
        "tp_size": 1,
        "dp_size": 1,
        **lora_server_args(args),
    }


def _log_kv_cache(runner: Runner) -> None:
    # The CPU cache grows on demand; report the upper bound the limits allow, in SGLang's words.
    config: Any = runner.model.config
    num_tokens = runner.max_running_requests * runner.context_length
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    size_gb = num_tokens * config.num_hidden_layers * kv_heads * head_dim * 4 / 2**30
    logger.info(f"KV Cache is allocated. #tokens: {num_tokens}, K size: {size_gb:.2f} GB, V size: {size_gb:.2f} GB")


def _configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stdout)  # flushed per record: launchers tail a log file
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


def _avail_gb() -> float:
    try:
        import psutil

        return float(psutil.virtual_memory().available / 2**30)
    except ImportError:  # psutil is a dependency, but the number is cosmetic
        return 0.0


if __name__ == "__main__":
    sys.exit(main())
