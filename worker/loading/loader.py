"""Model resolution and checkpoint reading, all offline.

Owns: turning a model name into a local HF directory (embedded names are built on demand, GGUF
files converted once into the cache by gguf.py),
reading its config and tokenizer (a folder we wrote, marked by `infer_cluster.json`, without
transformers' `Auto*` classes: `complete_config`), and streaming tensors out of
`*.safetensors` files (single file or a sharded index). Errors are `ModelNotFoundError` with
the path and what was missing.
To add a weight format: add an `iter_*` function and pick it in `iter_checkpoint`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import torch

from infer_cluster.protocol import ModelNotFoundError

from infer_cluster.worker.loading.embedded import EMBEDDED_MODELS, ensure_embedded_model
from infer_cluster.worker.loading.gguf import ensure_converted, find_gguf


def resolve_model_path(model: str) -> Path:
    """The HF folder to serve `model` from: an embedded name, an HF folder (config.json and
    weights), or a GGUF file (`x.gguf`, or a folder with no config.json holding exactly one),
    converted once into the cache (gguf.py)."""
    if model in EMBEDDED_MODELS:
        return ensure_embedded_model(model)
    gguf_file = find_gguf(model)
    if gguf_file is not None:
        return ensure_converted(gguf_file)
    path = Path(os.path.expanduser(model))
    if not path.is_dir():
        raise ModelNotFoundError(
            f"model {model!r} is neither a local directory, a .gguf file nor an embedded model "
            f"({', '.join(EMBEDDED_MODELS)}); downloads are not supported")
    if not (path / "config.json").exists():
        raise ModelNotFoundError(f"model directory {str(path)!r} has no config.json")
    return path


def resolve_tokenizer_path(tokenizer: str) -> Path:
    """A tokenizer folder needs no config.json (only the tokenizer files); embedded names too."""
    if tokenizer in EMBEDDED_MODELS:
        return ensure_embedded_model(tokenizer)
    gguf_file = find_gguf(tokenizer)
    if gguf_file is not None:
        return ensure_converted(gguf_file)
    path = Path(os.path.expanduser(tokenizer))
    if not path.is_dir():
        raise ModelNotFoundError(f"tokenizer {tokenizer!r} is neither a local directory nor an embedded "
                                 f"model ({', '.join(EMBEDDED_MODELS)})")
    return path


def complete_config(path: Path) -> bool:
    """Whether `path` is a folder we wrote (gguf.py's conversion, embedded.py's checkpoints):
    its config.json states every field, the family's defaults included, and its tokenizer is a
    `PreTrainedTokenizerFast`."""
    try:
        marker = json.loads((path / "infer_cluster.json").read_text())
    except (OSError, ValueError, TypeError):
        return False
    return isinstance(marker, dict) and ("gguf" in marker or marker.get("complete_config") is True)


def load_hf_config(path: Path):
    """The model's config: transformers' `AutoConfig`, which fills each family's defaults, or,
    for a folder we wrote, its complete config.json as attributes. The second needs no
    transformers import (about 2.5 s of a 2-core machine's start, most of a cached load)."""
    if complete_config(path):
        try:
            return SimpleNamespace(**json.loads((path / "config.json").read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise ModelNotFoundError(f"cannot read config in {str(path)!r}: {exc}") from None
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises many types for a bad config
        raise ModelNotFoundError(f"cannot read config in {str(path)!r}: {exc}") from None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def load_tokenizer(path: Path):
    """transformers' tokenizer of `path`. A folder we wrote gets its class directly:
    `AutoTokenizer` would first import every config class (over a second)."""
    if not any((path / n).exists() for n in TOKENIZER_FILES):
        raise ModelNotFoundError(f"model directory {str(path)!r} has no tokenizer (none of "
                                 f"{', '.join(TOKENIZER_FILES)})")
    if complete_config(path):
        from transformers import PreTrainedTokenizerFast as Tokenizer
    else:
        from transformers import AutoTokenizer as Tokenizer
    try:
        return Tokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        raise ModelNotFoundError(f"cannot load a tokenizer from {str(path)!r}: {exc}") from None


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"no *.safetensors weights in {str(path)!r} "
                                 f"(use load_format='dummy' for random weights)")
    return files


def iter_checkpoint(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for file in checkpoint_files(path):
        try:
            f = safe_open(str(file), framework="pt")
        except Exception as exc:  # SafetensorError, OSError: a truncated or foreign file
            raise ModelNotFoundError(f"cannot read weights {str(file)!r}: {exc}") from None
        with f:
            for name in f.keys():
                yield name, f.get_tensor(name)
