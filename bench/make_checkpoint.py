"""Random-weight checkpoints of real architectures and sizes, with the default model's tokenizer, offline.

Not a benchmark itself: it makes the models that the size benchmarks load. No hub is reachable on
these machines, and costs (start-up, memory, throughput, weight sync) depend on shapes, not on
trained values: a checkpoint here has a real architecture's config, weights drawn as transformers
initialises them (normal, std = initializer_range) from a fixed seed, and SmolLM2's tokenizer and
chat template (vocabulary 49,152, so embeddings are smaller than the originals'). Text from them
is noise and their greedy choices are near-ties: compare them by logprobs of fixed texts.

Shapes (`--shape`; parameters with the 49,152-token vocabulary):

    llama-1.7b      SmolLM2-1.7B's (Llama; 24 layers, hidden 2048, MHA, tied embeddings)   1.71B
    llama-7b        Llama-2-7B's (32 layers, hidden 4096, MHA, untied)                      6.88B
    qwen-1.5b       Qwen2.5-1.5B's (Qwen2: q/k/v biases, GQA 12/2 heads, tied)               1.39B
    qwen-7b         Qwen2.5-7B's (Qwen2, GQA 28/4 heads, untied)                             6.88B
    tiny-llama, tiny-qwen, tiny-qwen-untied    a few MB each, for tests

    python bench/make_checkpoint.py --shape llama-7b --out /tmp/ckpt/llama-7b --device cuda
    python bench/make_checkpoint.py --list

Writes safetensors in bf16, `config.json`, the tokenizer files, and `rlgen_checkpoint.json`
(shape, parameter count, seed, dtype, rlgen commit); prints one line with the count and size.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

# Config fields per shape; every shape shares the tokenizer's vocabulary and special ids.
SHAPES: dict[str, dict[str, Any]] = {
    "llama-1.7b": {"arch": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
                   "num_attention_heads": 32, "num_key_value_heads": 32, "tie_word_embeddings": True,
                   "rope_theta": 130000.0, "max_position_embeddings": 8192},
    "llama-7b": {"arch": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "num_key_value_heads": 32, "tie_word_embeddings": False,
                 "rope_theta": 10000.0, "max_position_embeddings": 4096},
    "qwen-1.5b": {"arch": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                  "num_attention_heads": 12, "num_key_value_heads": 2, "tie_word_embeddings": True,
                  "rope_theta": 1000000.0, "max_position_embeddings": 32768},
    "qwen-7b": {"arch": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                "num_attention_heads": 28, "num_key_value_heads": 4, "tie_word_embeddings": False,
                "rope_theta": 1000000.0, "max_position_embeddings": 32768},
    "tiny-llama": {"arch": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 4, "tie_word_embeddings": True,
                   "rope_theta": 10000.0, "max_position_embeddings": 2048},
    "tiny-qwen": {"arch": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True,
                  "rope_theta": 1000000.0, "max_position_embeddings": 2048},
    "tiny-qwen-untied": {"arch": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": False,
                         "rope_theta": 1000000.0, "max_position_embeddings": 2048},
}  # fmt: skip
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "chat_template.jinja", "generation_config.json")


def config_for(shape: str, tokenizer: Any) -> Any:
    """The transformers config of `shape`, with `tokenizer`'s vocabulary and special ids."""
    from transformers import LlamaConfig, Qwen2Config

    if shape not in SHAPES:
        raise SystemExit(f"unknown shape {shape!r}; one of: {', '.join(SHAPES)}")
    fields = dict(SHAPES[shape])
    arch = fields.pop("arch")
    common = {"vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
              "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
              "initializer_range": 0.02, "rms_norm_eps": 1e-5 if arch == "llama" else 1e-6}
    if arch == "llama":
        return LlamaConfig(**fields, **common, hidden_act="silu", attention_bias=False, mlp_bias=False)
    return Qwen2Config(**fields, **common, hidden_act="silu", use_sliding_window=False)


def make(shape: str, out: Path, *, tokenizer_path: str, device: str = "cpu", seed: int = 0) -> dict[str, Any]:
    """Build `shape` with random weights (bf16) and save it with the tokenizer to `out`; returns its record."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    config = config_for(shape, tokenizer)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    for name in TOKENIZER_FILES:  # what save_pretrained does not write (chat template file, generation config)
        src = Path(tokenizer_path) / name
        if src.exists() and not (out / name).exists():
            shutil.copy(src, out / name)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    record = {"shape": shape, "architecture": type(model).__name__, "parameters": params,
              "tied_embeddings": bool(config.tie_word_embeddings), "dtype": "bfloat16", "seed": seed,
              "safetensors_bytes": size, "tokenizer": str(tokenizer_path), "seconds": round(time.perf_counter() - t0, 1),
              "config": {k: SHAPES[shape][k] for k in SHAPES[shape] if k != "arch"}}
    try:
        import _common

        record["environment"] = _common.environment()
    except Exception:  # run outside bench/ (imported by tests): the record still names the shape
        pass
    (out / "rlgen_checkpoint.json").write_text(json.dumps(record, indent=1, default=str))
    del model
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tokenizer", default=None, help="tokenizer files to use (default: rlgen's default model)")
    parser.add_argument("--device", default="cpu", help="where to draw the weights (cuda is much faster at 7B)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="print the shapes and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, fields in SHAPES.items():
            print(f"{name:18s} {fields}")
        return
    if args.shape is None or args.out is None:
        parser.error("--shape and --out are required (or --list)")
    tokenizer = args.tokenizer
    if tokenizer is None:
        import rlgen

        tokenizer = rlgen.resolve_model(None).path
    record = make(args.shape, args.out, tokenizer_path=tokenizer, device=args.device, seed=args.seed)
    print(f"{args.shape}: {record['architecture']}, {record['parameters'] / 1e9:.3f}B parameters, "
          f"{record['safetensors_bytes'] / 2**30:.2f} GiB, {record['seconds']} s -> {args.out}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
