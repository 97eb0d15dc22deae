"""GGUF tensors -> float32 HF-named tensors, streamed into one safetensors file.

Owns: the GGUF -> HF tensor-name table, the supported tensor types, undoing llama.cpp's Q/K row
order for Llama-style models, and a safetensors writer that never holds more than one bounded
chunk of one tensor (`CHUNK_BYTES` of float32 output) in memory. Never imports torch: the
dequantization is `gguf.quants.dequantize` (numpy), and the safetensors layout is written here.

To support another tensor: add its GGUF leaf name to `_LAYER_NAMES` (or `_GLOBAL_NAMES`).
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import BinaryIO, Iterator, Optional

import numpy as np

from infer_cluster.protocol import ModelNotFoundError

# The float and quantized types `gguf.quants.dequantize` reads that we accept. The I-quants and
# ternary types are refused: they are rare in the model families we serve, and refusing them
# by name beats a silent mis-read if a gguf release changes their layout.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

CHUNK_BYTES = 64 << 20  # float32 output per dequantized chunk of rows

_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_LAYER = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_CONSUMED = {"rope_freqs.weight"}  # read into the config (gguf_config.rope_scaling), not a weight


def hf_tensor_name(name: str) -> Optional[str]:
    """The HF checkpoint name of a GGUF tensor; None for one the config consumed. Raises for a
    tensor we do not know (better than serving a model with a part silently missing)."""
    if name in _CONSUMED:
        return None
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _LAYER.match(name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    raise ModelNotFoundError(f"GGUF tensor {name!r} has no counterpart in the models we serve")


def hf_shape(tensor) -> list[int]:
    """GGUF lists dimensions fastest-varying first; HF (row-major) the other way round."""
    return [int(d) for d in reversed(tensor.shape)]


def check_tensor_types(reader, path) -> None:
    for t in reader.tensors:
        if t.tensor_type.name not in SUPPORTED_TYPES:
            raise ModelNotFoundError(f"GGUF file {str(path)!r}: tensor {t.name!r} has type "
                                     f"{t.tensor_type.name}, which is not supported "
                                     f"({', '.join(SUPPORTED_TYPES)})")


def rope_row_order(rows: int, num_heads: int) -> np.ndarray:
    """For each HF row of a Q or K projection (or bias), the GGUF row holding it.

    Within one head of `d` rows, HF keeps the rotary pairs `(i, i + d/2)` half a head apart
    (rotate-half), llama.cpp's converter interleaves them as rows `(2i, 2i + 1)`. So HF row
    `h*d + s*d/2 + i` (s = 0 or 1) is GGUF row `h*d + 2i + s`.
    """
    head = rows // num_heads
    if head * num_heads != rows or head % 2:
        raise ModelNotFoundError(f"cannot undo the rotary row order: {rows} rows over "
                                 f"{num_heads} heads is not a whole, even head size")
    half = head // 2
    h, s, i = np.meshgrid(np.arange(num_heads), np.arange(2), np.arange(half), indexing="ij")
    return (h * head + 2 * i + s).reshape(-1)


def row_orders(config: dict, permuted_qk: bool) -> dict[str, int]:
    """Which HF projections need `rope_row_order`, and over how many heads."""
    if not permuted_qk:
        return {}
    return {"self_attn.q_proj": config["num_attention_heads"],
            "self_attn.k_proj": config["num_key_value_heads"]}


def _head_count(hf_name: str, orders: dict) -> Optional[int]:
    for proj, heads in orders.items():
        if f".{proj}." in hf_name:
            return heads
    return None


def iter_chunks(tensor, order: Optional[np.ndarray]) -> Iterator[np.ndarray]:
    """The tensor as float32 HF-layout rows, a bounded chunk at a time (whole rows; GGUF blocks
    never straddle rows, so any row range dequantizes on its own)."""
    from gguf.quants import dequantize

    shape = hf_shape(tensor)
    data = tensor.data  # a memory map: only the rows read are paged in
    if len(shape) == 1:
        out = dequantize(np.asarray(data).reshape(-1) if order is None else data[order], tensor.tensor_type)
        yield np.ascontiguousarray(out, dtype=np.float32).reshape(shape)
        return
    rows, row_elems = shape[0], int(np.prod(shape[1:]))
    step = max(1, CHUNK_BYTES // (4 * row_elems))
    flat = data.reshape(rows, -1)
    for start in range(0, rows, step):
        part = flat[start:start + step] if order is None else flat[order[start:start + step]]
        out = dequantize(part, tensor.tensor_type)
        yield np.ascontiguousarray(out, dtype=np.float32).reshape(-1, *shape[1:])


def write_safetensors(reader, config: dict, permuted_qk: bool, out_path: Path) -> int:
    """Write every weight of `reader` as float32 into `out_path`; returns the bytes of weights.

    The header (names, shapes, offsets) is known before any data is read, so it goes first and
    each tensor follows in file order, a chunk at a time: memory stays at one chunk however big
    the model is."""
    orders = row_orders(config, permuted_qk)
    plan, header, offset = [], {}, 0
    for t in reader.tensors:
        name = hf_tensor_name(t.name)
        if name is None:
            continue
        shape = hf_shape(t)
        size = 4 * int(np.prod(shape))
        plan.append((t, name, shape, size))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned
    with open(out_path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for t, name, shape, size in plan:
            heads = _head_count(name, orders)
            order = rope_row_order(shape[0], heads) if heads else None
            _write_tensor(f, t, order, name, size)
    return offset


def _write_tensor(f: BinaryIO, tensor, order, name: str, size: int) -> None:
    written = 0
    for chunk in iter_chunks(tensor, order):
        f.write(memoryview(chunk).cast("B"))
        written += chunk.nbytes
    if written != size:  # a layout the dequantizer read differently from the header's shape
        raise ModelNotFoundError(f"GGUF tensor {tensor.name!r} ({name}) gave {written} bytes, "
                                 f"expected {size}")
