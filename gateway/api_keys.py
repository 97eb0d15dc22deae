"""API keys for the HTTP gateway: reading and checking them.

Owns: `read_api_keys` (`--api-key` / `INFER_CLUSTER_API_KEY`, and `--api-key-file` /
`INFER_CLUSTER_API_KEY_FILE` with one key per line) and `check_key` (a key must fit an HTTP
header). `api_key_gate.ApiKeyGate` enforces them. The ZMQ side has its own authentication
(CURVE, `infer-cluster keygen`); these keys only guard the HTTP door.
Standard library only, so the CLI checks keys before it loads FastAPI. Never imports torch.
"""

from __future__ import annotations

import os
from typing import Optional


def check_key(key: str, where: str) -> str:
    """A key must fit an HTTP header as one token: printable ASCII, no spaces."""
    if not key:
        raise ValueError(f"{where}: an API key must not be empty")
    if not all(33 <= ord(c) <= 126 for c in key):
        raise ValueError(f"{where}: an API key may hold only printable ASCII without spaces")
    return key


def read_api_keys(key: Optional[str] = None, key_file: Optional[str] = None) -> tuple[str, ...]:
    """The accepted keys: `key` itself and every line of `key_file` (blank lines and lines
    starting with `#` are skipped). Raises ValueError naming the file or the problem."""
    keys = []
    if key is not None:
        keys.append(check_key(key.strip(), "--api-key"))
    if key_file is not None:
        path = os.path.expanduser(key_file)
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--api-key-file {key_file!r}: cannot read it ({exc})") from None
        found = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not found:
            raise ValueError(f"--api-key-file {key_file!r} holds no key (one key per line)")
        keys += [check_key(k, f"--api-key-file {key_file!r}") for k in found]
    return tuple(dict.fromkeys(keys))
