"""`load_model`: what an engine reads before it builds a runner.

Owns: resolving `EngineConfig.model` (and `tokenizer`) to local folders, reading the config and
the tokenizer (worker/loading/loader.py), the `ModelSpec`, the context length the engine will
allow, the EOS ids and the detokenizer's byte table. No tensors: the runner loads the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from infer_cluster.protocol import InvalidRequestError

from infer_cluster.worker.config import EngineConfig
from infer_cluster.worker.loading.loader import load_hf_config, load_tokenizer, resolve_model_path, resolve_tokenizer_path
from infer_cluster.worker.models.decoder import ModelSpec
from infer_cluster.worker.text.byte_tables import piece_table


@dataclass
class LoadedModel:
    path: Path
    hf_config: Any              # transformers' config, or a namespace of a complete config.json
    tokenizer: Any
    spec: ModelSpec
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    byte_table: Optional[list[bytes]]  # None: the detokenizer's window path


def load_model(config: EngineConfig) -> LoadedModel:
    path = resolve_model_path(config.model)
    hf_config = load_hf_config(path)
    tokenizer = load_tokenizer(resolve_tokenizer_path(config.tokenizer) if config.tokenizer else path)
    try:
        spec = ModelSpec.from_hf_config(hf_config)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    return LoadedModel(path, hf_config, tokenizer, spec, max_model_len(config, spec),
                       eos_ids(hf_config, tokenizer), piece_table(tokenizer))


def max_model_len(config: EngineConfig, spec: ModelSpec) -> int:
    """`config.max_model_len`, or the model's `max_position_embeddings` when unset; more than
    the model's is refused."""
    limit = spec.max_position_embeddings
    if config.max_model_len is None:
        return limit
    if config.max_model_len > limit:
        raise InvalidRequestError(f"max_model_len ({config.max_model_len}) exceeds the model's "
                                  f"max_position_embeddings ({limit})")
    return config.max_model_len


def eos_ids(hf_config, tokenizer) -> tuple[int, ...]:
    """The config's and the tokenizer's EOS ids, together."""
    ids = set()
    for src in (getattr(hf_config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(x) for x in src)
    return tuple(sorted(ids))
