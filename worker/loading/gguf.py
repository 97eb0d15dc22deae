"""GGUF checkpoints: converted once into an ordinary HF folder in the cache, then served as one.

How it works. `resolve_model_path` hands us a `.gguf` file (named directly, the only `.gguf` in
a folder without config.json, or an embedded name such as `smollm2-135m-instruct`).
`ensure_converted` keys it by a cheap fingerprint of the file and, on a miss, converts it into
`$INFER_CLUSTER_CACHE/gguf-<version>/<stem>-<key>/`:
  - config.json from the metadata (gguf_config.py: sizes, rope, tied embeddings when the file
    has no `output.weight`, bos/eos ids);
  - model.safetensors, every tensor dequantized by `gguf.quants.dequantize` and renamed to HF
    names, Q and K rows of Llama-style models put back in HF's rotate-half order
    (gguf_weights.py), written a bounded chunk at a time;
  - the tokenizer files, built by transformers from the file's vocabulary, merges and chat
    template (`tokenizer.chat_template`).
It writes into a temporary folder beside the target and renames it into place, so a reader
never sees half a conversion and two processes converting at once both end with one folder.
The temporary folder's name holds the host and pid of its writer: a conversion killed half way
(hundreds of MB on disk) is removed by the next one on that host, once its writer is gone.
Every later start finds the folder and goes straight through the safetensors loader.

Why this way. Converting to the format the loader already reads keeps one weight path for
everything (tensor and pipeline sharding, fused QKV, dummy weights): GGUF adds no code to the
model or the runner. The weights are stored in float32, not the serving dtype: dequantized
values (a float16 scale times a small integer, plus an offset) are exact in float32 and not in
bfloat16 or float16, one folder then serves every dtype (the loader casts on copy), and a float32
engine computes with exactly the weights gguf-py (and so transformers' GGUF loader) dequantizes.
The price is disk, 4 bytes per parameter; memory is not: tensors stream through in chunks
(SmolLM2-135M: peak RSS 545 MiB converting, beside 513 MiB of float32 weights).

The fingerprint is size + mtime (nanoseconds) + xxh64 of the first and last MiB, not a hash of
the whole file: reading a multi-GB file on every start would cost seconds, and a changed file
almost always changes its size, its mtime, or its header/tail (metadata, last tensors). A file
rewritten in place with the same size within one mtime tick and identical ends would be missed;
delete its cache folder then. `CONVERT_VERSION` is part of the path, so a change to the
conversion itself invalidates old folders.

Must never do tensor work in torch (the conversion is numpy; transformers, which loads torch,
only builds the tokenizer). Errors are one-line `ModelNotFoundError`s naming the file. To
support another architecture, see gguf_config.py; another tensor, gguf_weights.py.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Optional

from infer_cluster.protocol import ModelNotFoundError

from infer_cluster.worker.loading.embedded import cache_root
from infer_cluster.worker.loading.gguf_config import field_value, gguf_arch, hf_config_dict
from infer_cluster.worker.loading.gguf_weights import check_tensor_types, write_safetensors

CONVERT_VERSION = "v1"
FINGERPRINT_BYTES = 1 << 20  # hashed from each end of the file


def find_gguf(model: str) -> Optional[Path]:
    """The GGUF file `model` names: a `.gguf` file, or a folder with no config.json that holds
    exactly one. None when `model` is something else (an HF folder, a missing path)."""
    path = Path(os.path.expanduser(model))
    if path.is_file():
        return path if path.suffix.lower() == ".gguf" else None
    if not path.is_dir() or (path / "config.json").exists():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise ModelNotFoundError(f"model directory {str(path)!r} has no config.json and "
                                 f"{len(found)} .gguf files ({', '.join(p.name for p in found[:4])}"
                                 f"{' ...' if len(found) > 4 else ''}); name the one to serve")
    return found[0] if found else None


def fingerprint(path: Path) -> str:
    """Size, mtime and the two ends of the file (see the module docstring for why not more)."""
    import xxhash

    st = path.stat()
    h = xxhash.xxh64()
    h.update(f"{st.st_size}:{st.st_mtime_ns}:".encode())
    with open(path, "rb") as f:
        h.update(f.read(FINGERPRINT_BYTES))
        if st.st_size > FINGERPRINT_BYTES:
            f.seek(max(FINGERPRINT_BYTES, st.st_size - FINGERPRINT_BYTES))
            h.update(f.read(FINGERPRINT_BYTES))
    return h.hexdigest()


def converted_path(path: Path) -> Path:
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in path.stem)[:80]
    return cache_root() / f"gguf-{CONVERT_VERSION}" / f"{stem}-{fingerprint(path)}"


def ensure_converted(path: Path) -> Path:
    """The HF folder of the GGUF file `path`, converting it on the first call (atomically, safe
    across processes)."""
    if not Path(path).is_file():
        raise ModelNotFoundError(f"GGUF file {str(path)!r} does not exist")
    path = Path(path).resolve()  # a link and its target share one cache folder
    target = converted_path(path)
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(target)
    tmp = Path(tempfile.mkdtemp(prefix=f"{_tmp_prefix(target)}{_HOST}-{os.getpid()}-",
                                dir=target.parent))
    try:
        convert_gguf(path, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").exists():  # lost a race only if the winner finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


_HOST = "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:64] or "host"


def _tmp_prefix(target: Path) -> str:
    return f".{target.name}-tmp-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def remove_abandoned(target: Path) -> list[Path]:
    """Remove the temporary folders of `target`'s conversions whose writer (a process of this
    host) has ended without finishing; those of other hosts (a shared cache) and of live
    writers stay. Returns what was removed."""
    prefix, removed = _tmp_prefix(target), []
    for tmp in target.parent.glob(f"{prefix}*"):
        parts = tmp.name[len(prefix):].split("-")  # host, pid, mkdtemp's suffix (no "-" in any)
        if len(parts) != 3 or parts[0] != _HOST or not parts[1].isdigit():
            continue
        if not _pid_alive(int(parts[1])):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


def _plain_reader_class():
    """`gguf.GGUFReader` whose `data` is a plain ndarray view of its memmap. The reader parses
    its metadata by slicing the file once per array element (49,152 vocabulary strings and the
    merges for SmolLM2), and numpy's memmap bookkeeping on every slice made that 2.9 s of the
    conversion; a plain view of the same mapping takes 0.95 s (2-core CPU, 2026-11-28). Only the
    documented `data` attribute is intercepted: the reader stores its memmap there first."""
    import numpy as np
    from gguf import GGUFReader

    class PlainReader(GGUFReader):
        @property
        def data(self):
            return self._plain_data

        @data.setter
        def data(self, value):
            self._plain_data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    return PlainReader


def open_reader(path: Path):
    """A `gguf.GGUFReader` over `path`, or a one-line error for a foreign or truncated file."""
    GGUFReader = _plain_reader_class()

    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelNotFoundError(f"{str(path)!r} is not a GGUF file (it does not start with "
                                 f"the bytes 'GGUF')")
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError / IndexError on a short file
        detail = (str(exc).splitlines() or [""])[0]
        raise ModelNotFoundError(f"cannot read GGUF file {str(path)!r}: truncated or corrupt "
                                 f"({type(exc).__name__}: {detail})") from None
    size = path.stat().st_size
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > size:
        raise ModelNotFoundError(f"GGUF file {str(path)!r} is truncated: its tensors end at byte "
                                 f"{end}, the file has {size}")
    return reader


def convert_gguf(path: Path, out_dir: Path) -> dict:
    """Write config.json, model.safetensors and the tokenizer of `path` into `out_dir`; returns
    timings in seconds (read, weights, tokenizer)."""
    times = {}
    started = time.perf_counter()
    reader = open_reader(path)
    _, arch = gguf_arch(reader, path)
    config = hf_config_dict(reader, path)
    check_tensor_types(reader, path)
    times["read"] = time.perf_counter() - started
    write_safetensors(reader, config, arch.permuted_qk, out_dir / "model.safetensors")
    times["weights"] = time.perf_counter() - started - times["read"]
    if field_value(reader, "tokenizer.ggml.model") is not None:
        write_tokenizer(path, reader, out_dir)
    times["tokenizer"] = time.perf_counter() - started - times["read"] - times["weights"]
    (out_dir / "infer_cluster.json").write_text(json.dumps(
        {"gguf": str(path.resolve()), "fingerprint": fingerprint(path), "version": CONVERT_VERSION,
         "weights_dtype": "float32"}, indent=1))
    # config.json last: its presence is what marks a folder complete (see ensure_converted)
    (out_dir / "config.json").write_text(json.dumps(config, indent=1))
    return times


def write_tokenizer(path: Path, reader, out_dir: Path) -> None:
    """The tokenizer transformers builds from the file's vocabulary, saved as tokenizer files.

    `PreTrainedTokenizerFast` with `gguf_file` builds the same backend tokenizer as
    `AutoTokenizer` does for the file without first parsing the whole file again for a model
    config (seconds on a large vocabulary); tests/loading checks the two encode alike."""
    from transformers import PreTrainedTokenizerFast

    try:
        tok = PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name,
                                                      local_files_only=True)
    except Exception as exc:
        detail = (str(exc).splitlines() or [""])[0]
        raise ModelNotFoundError(f"cannot build a tokenizer from GGUF file {str(path)!r}: "
                                 f"{type(exc).__name__}: {detail}") from None
    template = field_value(reader, "tokenizer.chat_template")
    if template and not getattr(tok, "chat_template", None):
        tok.chat_template = template
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    for attr in ("bos", "eos"):  # the ids the config states must name the same tokens here
        token_id = field_value(reader, f"tokenizer.ggml.{attr}_token_id")
        if token_id is not None and tokens is not None and getattr(tok, f"{attr}_token_id") != token_id:
            setattr(tok, f"{attr}_token", tokens.contents(int(token_id)))
    tok.save_pretrained(str(out_dir))
