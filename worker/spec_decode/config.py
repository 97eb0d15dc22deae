"""`SpeculativeConfig`: `EngineConfig.speculative_config` validated, in vLLM's shape.

Owns: parsing the user's value (a dict, a JSON string from `--speculative-config`, or a
`SpeculativeConfig`), the checks of each field (messages name the field, e.g.
`speculative_config.num_speculative_tokens must be 1..32`), and `refuse_unsupported`: the
engine settings speculation does not run with yet, refused at configuration time with one line
naming both settings rather than producing wrong output.
Must never import torch (the CLI builds configs without it).
To extend: add the field with a default here, check it in `__post_init__`, document it in
docs/spec_decode.md.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Optional

from infer_cluster.protocol.errors import ConfigError

METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 32
MAX_LOOKUP = 64  # longest n-gram the proposer matches


def _whole(name: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"speculative_config.{name} must be {low}..{high}, got {value!r}")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4
    # The shortest suffix n-gram that may propose. 3, not 2: replayed over the input-grounded
    # workload's greedy SmolLM2 outputs (bench/spec_replay.py, 2026-11-29), a 2-gram match gave
    # 2.7 tokens a verify step where a verify step costs ~2.7 plain ones on the H200, and 3..4
    # took the estimated batch-1 speedup from 1.66x to 1.80x at k = 8 (1.83x to 2.04x at 16).
    prompt_lookup_min: int = 3
    prompt_lookup_max: int = 4  # the longest one tried (longest first)
    model: Optional[str] = None  # draft_model only: a model path or embedded name
    # vLLM's name: no proposals in a step where this many requests (or more) are running; None:
    # always propose. Speculation pays at small batches and costs at large ones (docs/spec_decode.md).
    disable_by_batch_size: Optional[int] = None
    # Our own (not vLLM's): each step speculates only where this engine measured speculating to
    # be faster than decoding at that batch size (worker/spec_decode/governor.py).
    adaptive: bool = True

    def __post_init__(self):
        if self.method not in METHODS:
            raise ConfigError(f"speculative_config.method must be one of {', '.join(METHODS)}, "
                              f"got {self.method!r}")
        if self.method == "draft_model" and (not isinstance(self.model, str) or not self.model.strip()):
            raise ConfigError("speculative_config.model is required for method 'draft_model' "
                              f"(a model path or embedded name), got {self.model!r}")
        _whole("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
        _whole("prompt_lookup_min", self.prompt_lookup_min, 1, MAX_LOOKUP)
        _whole("prompt_lookup_max", self.prompt_lookup_max, 1, MAX_LOOKUP)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigError(f"speculative_config.prompt_lookup_min ({self.prompt_lookup_min}) must "
                              f"be <= prompt_lookup_max ({self.prompt_lookup_max})")
        if self.disable_by_batch_size is not None:
            _whole("disable_by_batch_size", self.disable_by_batch_size, 1, 1 << 20)
        if not isinstance(self.adaptive, bool):
            raise ConfigError(f"speculative_config.adaptive must be true or false, got {self.adaptive!r}")
        if self.model is not None and self.method != "draft_model":
            raise ConfigError("speculative_config.model is for method 'draft_model' only")

    @classmethod
    def parse(cls, value: Any) -> Optional["SpeculativeConfig"]:
        """None (off), a `SpeculativeConfig`, a dict, or its JSON text (the CLI's flag)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            if not value.strip() or value.strip() == "null":
                return None
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ConfigError(f"speculative_config is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"speculative_config must be a map like {{\"method\": \"ngram\", "
                              f"\"num_speculative_tokens\": 4}}, got {value!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ConfigError(f"speculative_config has unknown field(s) {', '.join(unknown)}; "
                              f"known: {', '.join(sorted(names))}")
        if "method" not in value:
            raise ConfigError("speculative_config.method is required (ngram or draft_model)")
        return cls(**value)

    def to_json(self) -> str:
        """The form the CLI forwards to a replica's `--speculative-config`."""
        return json.dumps({k: v for k, v in dataclasses.asdict(self).items() if v is not None})


def refuse_unsupported(config) -> None:
    """Raise `ConfigError` naming both settings where `config` (an `EngineConfig` with
    speculation on) asks for something verification does not do yet."""
    if config.pipeline_parallel_size > 1:
        raise ConfigError("speculative_config does not run with pipeline_parallel_size > 1 yet "
                          "(its micro-batches continue rows from drawn ids the verify step would "
                          "change); use tensor_parallel_size or a single-rank replica")
