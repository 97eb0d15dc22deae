"""The coordinator: routes client requests to engine replicas and streams results back.

Owns: the client and replica ROUTER sockets (`server.py`), their handler tables (`frontend.py`,
`backend.py`), request / replica / client bookkeeping (`requests.py`, `registry.py`,
`clients.py`), dispatch and failover (`dispatcher.py`), routing policies (`routing.py`), and the
`infer-cluster` CLI (`cli.py`, `cli_client.py`, `launcher.py`, `loadgen.py`).
Must never import torch, not even transitively: it runs where no GPU stack is installed
(a test checks). Architecture and failure handling: `docs/cluster.md`.

To extend: a new message gets a handler in `frontend.py` or `backend.py`; a new routing policy
a class in `routing.py`; request bookkeeping stays in `dispatcher.py`, sockets in `server.py`.
"""
