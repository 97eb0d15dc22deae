"""One decoder-only transformer covering Llama, Mistral, Qwen2 (qkv bias) and Qwen3 (q/k norm),
with tied or untied embeddings, GQA, and tensor/pipeline sharding.

Owns: the module tree, the forward pass over a flat batch of tokens with an explicit
`AttentionMetadata`, and the mapping from HF checkpoint names to our fused parameters
(`load_weights`). All math goes through `kernels/` dispatch functions. Never reads any global
state: the KV caches and metadata arrive as arguments.

To add a family: extend `ModelSpec.from_hf_config` (how its config names map to ours) and, if
its checkpoint names differ, `_checkpoint_target`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Optional

import torch
from torch import nn

from infer_cluster.kernels import build_rope_cache, paged_attention, qkv_prep, rms_norm, silu_and_mul
from infer_cluster.kernels.attention import decode_order
from infer_cluster.kernels.attention_decode_plan import longest_first_enabled
from infer_cluster.kernels.gemm import is_partials
from infer_cluster.kernels.mlp import fused_mlp_enabled, fused_mlp_small, use_fused_mlp
from infer_cluster.kernels.norm import add_rms_norm

from infer_cluster.worker.models.parallel import (ColumnParallelLinear, ParallelLMHead, ParallelState, RowParallelLinear,
                       VocabParallelEmbedding)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class AttentionMetadata:
    """Per-step attention inputs (see kernels/attention.py for the exact contract)."""

    slot_mapping: torch.Tensor      # [num_tokens] int64, -1 = padding
    block_tables: torch.Tensor      # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor          # [num_seqs] int32, context length incl. this step's tokens
    query_start_loc: torch.Tensor   # [num_seqs + 1] int32
    max_query_len: int              # host int: lets attention pick the decode kernel without a sync
    # [num_seqs] int32 or None: runs of rows that are one request's positions (a verify step as
    # decode rows, `step_rows.row_spans`), so decode attention reads their KV once per chunk
    row_span: Optional[torch.Tensor] = None
    # [num_seqs] int32 or None: the decode kernel's launch order (longest context first), set by
    # the model once a step for decode steps (`kernels.attention.decode_order`)
    decode_order: Optional[torch.Tensor] = None


def with_decode_order(meta: AttentionMetadata, hidden: torch.Tensor) -> AttentionMetadata:
    """`meta` with its decode launch order (longest context first, one sort for all layers) on a
    CUDA decode step of several sequences without runs; as it is otherwise (one sequence has
    nothing to order; `INFER_CLUSTER_DECODE_LONGEST_FIRST=0` keeps the row order)."""
    if (meta.decode_order is not None or meta.max_query_len != 1 or meta.row_span is not None
            or meta.seq_lens.shape[0] < 2 or not hidden.is_cuda or not longest_first_enabled()):
        return meta
    return dataclasses.replace(meta, decode_order=decode_order(meta.seq_lens))


class LayerKV(NamedTuple):
    """One layer's paged KV (see kernels/attention.py and kernels/kv_append.py): K and V
    `[num_blocks, block_size, num_kv_heads, head_dim]` in the model dtype, or int8 codes with
    float32 scales `[num_blocks, num_kv_heads, block_size]` (None for a float cache)."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: Optional[torch.Tensor] = None
    v_scale: Optional[torch.Tensor] = None


@dataclass
class ModelSpec:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    rope: dict

    @classmethod
    def from_hf_config(cls, c) -> "ModelSpec":
        mt = getattr(c, "model_type", None)
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {mt!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        rope = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
        if "rope_theta" not in rope:
            rope["rope_theta"] = getattr(c, "rope_theta", 10000.0)
        rope.setdefault("rope_type", rope.get("type") or "default")  # as transformers 5 spells it
        return cls(model_type=mt, vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                   intermediate_size=c.intermediate_size, num_layers=c.num_hidden_layers,
                   num_heads=c.num_attention_heads,
                   num_kv_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
                   head_dim=head_dim, rms_norm_eps=c.rms_norm_eps,
                   max_position_embeddings=c.max_position_embeddings,
                   tie_word_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
                   qkv_bias=mt == "qwen2" or bool(getattr(c, "attention_bias", False)),
                   qk_norm=mt == "qwen3", rope=rope)


def rope_inv_freq(spec: ModelSpec) -> torch.Tensor:
    """Inverse frequencies for the default, linear and llama3 rope types."""
    d = spec.head_dim
    base = float(spec.rope["rope_theta"])
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    kind = spec.rope.get("rope_type", spec.rope.get("type", "default")) or "default"
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(spec.rope["factor"])
    if kind == "llama3":
        factor, lo, hi = (float(spec.rope[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
        old_len = float(spec.rope["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / hi) & ~(wavelen > old_len / lo)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"rope_type {kind!r} is not supported (default, linear, llama3)")


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)

    def forward(self, x, residual=None):
        return rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, ps: ParallelState):
        super().__init__()
        tp = ps.tp_size
        if spec.num_heads % tp:
            raise ValueError(f"num_attention_heads ({spec.num_heads}) is not divisible by tensor_parallel_size ({tp})")
        kv_replicas = 1
        if spec.num_kv_heads < tp:  # fewer KV heads than ranks: replicate each KV head
            if tp % spec.num_kv_heads:
                raise ValueError(f"tensor_parallel_size ({tp}) must be a multiple of num_key_value_heads ({spec.num_kv_heads})")
            kv_replicas = tp // spec.num_kv_heads
        self.num_heads = spec.num_heads // tp
        self.num_kv_heads = max(1, spec.num_kv_heads // tp)
        self.head_dim = d = spec.head_dim
        self.scale = d ** -0.5
        self.q_size, self.kv_size = self.num_heads * d, self.num_kv_heads * d
        self.qkv_proj = ColumnParallelLinear(spec.hidden_size, [spec.num_heads * d, spec.num_kv_heads * d,
                                                                spec.num_kv_heads * d],
                                             spec.qkv_bias, ps, num_replicas=[1, kv_replicas, kv_replicas])
        self.o_proj = RowParallelLinear(spec.num_heads * d, spec.hidden_size, False, ps)
        self.q_norm = RMSNorm(d, spec.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(d, spec.rms_norm_eps) if spec.qk_norm else None

    def forward(self, x, positions, meta: AttentionMetadata, kv_cache, rope_cache):
        return self.attend(self.qkv_proj(x), positions, meta, kv_cache, rope_cache)

    def attend(self, qkv, positions, meta: AttentionMetadata, kv_cache, rope_cache):
        """Everything after the qkv projection: prep, attention, o_proj."""
        n = qkv.shape[0]
        k_cache, v_cache, k_scale, v_scale = kv_cache
        # q/k norm (Qwen3), rotary and the KV append in one kernel; q may be a view of qkv.
        qn, kn = self.q_norm, self.k_norm
        norm_args = (qn.weight, kn.weight, qn.eps) if qn is not None else (None, None, 1e-6)
        q = qkv_prep(qkv, positions, *rope_cache, meta.slot_mapping, k_cache, v_cache, *norm_args,
                     k_scale, v_scale, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                     head_dim=self.head_dim)
        out = paged_attention(q, k_cache, v_cache, meta.block_tables, meta.query_start_loc,
                              meta.seq_lens, self.scale, meta.max_query_len, k_scale, v_scale,
                              meta.row_span, meta.decode_order)
        # Split-K partial sums where the table splits o's K: the MLP's add + norm adds them.
        return self.o_proj.forward_split(out.reshape(n, self.q_size))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, ps: ParallelState):
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear(spec.hidden_size, [spec.intermediate_size] * 2, False, ps)
        self.down_proj = RowParallelLinear(spec.intermediate_size, spec.hidden_size, False, ps)
        # One launch for norm + gate_up + SiLU + down (kernels/mlp.py) where its rule says so; one
        # rank only (its float32 sums are the layer's output, with no all-reduce between).
        self.fuse = (ps.tp_size == 1 and fused_mlp_enabled() and self.gate_up_proj.fuse_norm
                     and self.gate_up_proj.use_gemv)

    def forward(self, x):
        return self.down_proj.forward_silu_mul(self.gate_up_proj(x))

    def forward_rms_norm(self, x, residual, norm: RMSNorm, split_out: bool = False):
        """`(forward(norm(x + residual)), x + residual)`. The SiLU-and-mul runs where it costs
        least: in the gate/up GEMM's epilogue at mid-size rows where the table has its row
        (kernels/gemm.py), else in the down projection's GEMV (small batches) or as a kernel of
        its own; the add + norm in the gate/up GEMV's prologue where that path allows. `x` may
        be split-K partial sums (the o projection's); with `split_out` the output may be too,
        for a next layer whose add + norm sums them."""
        gate_up, down = self.gate_up_proj, self.down_proj
        partials = is_partials(x)
        silu = gate_up.silu_applies(x)  # False for partials (not 2-D): asked again of the norm's output
        if partials or silu:
            h, residual = add_rms_norm(x, residual, norm.weight, norm.eps)
            if partials:
                silu = gate_up.silu_applies(h)
            y = gate_up.forward_silu(h) if silu else silu_and_mul(gate_up(h))
            return (down.forward_split(y) if split_out else down(y)), residual
        y, residual = gate_up.forward_rms_norm(x, residual, norm.weight, norm.eps)
        return down.forward_silu_mul(y), residual

    def fused_applies(self, x: torch.Tensor) -> bool:
        """Whether a step of rows like `x` runs the fused MLP (`forward_fused`)."""
        return use_fused_mlp(self.fuse, x, self.down_proj.shard_size)

    def forward_fused(self, x, residual, norm: RMSNorm, sums: tuple):
        """`(float32 down output, x + residual)` of `norm(x + residual)`; `sums` = (the zeroed
        accumulator to add into, the other one to zero or None)."""
        return fused_mlp_small(x, residual, norm.weight, norm.eps, self.gate_up_proj.weight,
                               self.down_proj.weight, *sums)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, ps: ParallelState):
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec, ps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = MLP(spec, ps)

    def forward(self, x, residual, positions, meta, kv_cache, rope_cache, mlp_sums=None,
                split_out=False):
        # Each add + norm runs in the projection after it (one launch on the small-batch path;
        # residual None on the first layer: the input is the residual). `mlp_sums`: the fused
        # MLP's accumulators (DecoderModel.forward); then the output is float32, which the next
        # add + norm rounds. `split_out`: the output may be split-K partial sums, which the
        # next layer's add + norm adds up (never the last layer's: its rows are selected).
        attn, mlp = self.self_attn, self.mlp
        norm1, norm2 = self.input_layernorm, self.post_attention_layernorm
        qkv, residual = attn.qkv_proj.forward_rms_norm(x, residual, norm1.weight, norm1.eps)
        h = attn.attend(qkv, positions, meta, kv_cache, rope_cache)
        if mlp_sums is not None:
            return mlp.forward_fused(h, residual, norm2, mlp_sums)
        return mlp.forward_rms_norm(h, residual, norm2, split_out)


def _pair(sums: Optional[torch.Tensor], i: int, last: int) -> Optional[tuple]:
    """Layer i's (accumulator, accumulator to zero) from a pair. Layers alternate the two: layer
    i adds into one and zeroes the other, which layer i - 1's MLP filled and layer i's qkv has
    read by then (the fused MLP zeroes after its PDL wait), and which layer i + 1 adds into.
    Layers 0 and 1 find theirs zeroed at the start."""
    if sums is None:
        return None
    return sums[i % 2], sums[(i + 1) % 2] if 0 < i < last else None


class DecoderModel(nn.Module):
    """Layers `[layer_start, layer_end)` of the model; the first stage owns the embedding, the
    last the final norm and LM head (pipeline parallel passes (hidden, residual) between)."""

    def __init__(self, spec: ModelSpec, ps: Optional[ParallelState] = None,
                 layer_start: int = 0, layer_end: Optional[int] = None):
        super().__init__()
        ps = ps or ParallelState()
        self.spec = spec
        self.ps = ps
        self.layer_start = layer_start
        self.layer_end = spec.num_layers if layer_end is None else layer_end
        self.is_first = layer_start == 0
        self.is_last = self.layer_end == spec.num_layers
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, ps) if self.is_first else None
        self.layers = nn.ModuleList(DecoderLayer(spec, ps) for _ in range(self.layer_start, self.layer_end))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps) if self.is_last else None
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size, ps) if self.is_last else None
        self.rope_cache: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    def keep_cublas(self) -> None:
        """Keep every layer linear off the Gluon mid-size GEMM (kernels/gemm.py). Eager engines
        do: each of its launches costs tens of microseconds of host time more than cuBLAS's,
        which CUDA graphs pay once at capture and an eager step pays every time."""
        for module in self.modules():
            if isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
                module.use_gemm = False

    def init_rope(self, max_positions: int, device) -> None:
        self.rope_cache = build_rope_cache(rope_inv_freq(self.spec).to(device), max_positions)

    def forward(self, input_ids, positions, meta: AttentionMetadata, kv_caches,
                hidden=None, residual=None, final_norm: bool = True):
        """Returns (hidden, residual); on the last stage hidden is final-normed, unless
        `final_norm=False`: then (hidden, residual) go to `compute_logits(hidden, residual)`
        (rows selected alike), which runs the final add + norm inside the LM head's GEMV."""
        if self.is_first:
            hidden = self.embed_tokens(input_ids)
        meta = with_decode_order(meta, hidden)
        sums = self._mlp_sums(hidden)
        last = len(self.layers) - 1
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            hidden, residual = layer(hidden, residual, positions, meta, kv_cache, self.rope_cache,
                                     _pair(sums, i, last), split_out=i < last)
        if hidden.dtype != residual.dtype and (final_norm or not self.is_last):
            hidden = hidden.to(residual.dtype)  # (compute_logits takes the float32 sums as they are)
        if self.is_last and final_norm:
            hidden, _ = self.norm(hidden, residual)
        return hidden, residual

    def _mlp_sums(self, hidden: torch.Tensor) -> Optional[torch.Tensor]:
        """The fused MLPs' zeroed float32 accumulator pair (`[2, rows, hidden]`) when this step
        runs them (kernels/mlp.py's rule), else None."""
        if not self.layers or not self.layers[0].mlp.fused_applies(hidden):
            return None
        return torch.zeros(2, *hidden.shape, dtype=torch.float32, device=hidden.device)

    def compute_logits(self, hidden: torch.Tensor, residual: Optional[torch.Tensor] = None,
                       gather: bool = True) -> torch.Tensor:
        """Logits of final-normed `hidden`; with `residual`, of the un-normed last-layer output
        and its residual (`forward(..., final_norm=False)`). `gather=False`: this rank's vocab
        shard only (for `lm_head.greedy_ids`)."""
        if residual is None:
            return self.lm_head.logits(hidden, gather)
        return self.lm_head.logits_rms_norm(hidden, residual, self.norm.weight, self.norm.eps, gather)

    # -- weights --------------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors into our (fused, sharded) parameters. Returns the names of
        our parameters that were loaded, so the caller can report missing ones."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            for target, shard_id in self._checkpoint_target(name):
                param = params.get(target)
                if param is None:
                    continue  # another pipeline stage's layer, or an unused buffer
                loader = getattr(param, "weight_loader", None)
                with torch.no_grad():
                    if loader is None:
                        param.data.copy_(tensor)
                    else:
                        loader(param, tensor.to(param.dtype), shard_id)
                loaded.add(target)
        return loaded

    _FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
              "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
    _LAYER = re.compile(r"^model\.layers\.(\d+)\.(.*)$")

    def _checkpoint_target(self, name: str) -> list[tuple[str, int]]:
        if "rotary_emb" in name:
            return []
        if name == "model.embed_tokens.weight":
            targets = [("embed_tokens.weight", 0)]
            if self.spec.tie_word_embeddings:
                targets.append(("lm_head.weight", 0))
            return targets
        if name == "lm_head.weight":
            return [] if self.spec.tie_word_embeddings else [("lm_head.weight", 0)]
        if name == "model.norm.weight":
            return [("norm.weight", 0)]
        m = self._LAYER.match(name)
        if not m:
            return []
        idx = int(m.group(1)) - self.layer_start
        rest = m.group(2)
        for ckpt, (ours, shard) in self._FUSED.items():
            if f".{ckpt}." in f".{rest}":
                return [(f"layers.{idx}.{rest.replace(ckpt, ours)}", shard)]
        return [(f"layers.{idx}.{rest}", 0)]
