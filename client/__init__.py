"""Client library: talk to an infer-cluster coordinator. Never imports torch.

`InferenceClient(address).submit(prompt, sampling_params)` -> `RequestHandle` with
`.result()`, `.stream()`, `.cancel()`, `.done()`, `.status`; `AsyncInferenceClient` offers the
same for asyncio. See `client/client.py` for the contract.
"""

from .async_client import AsyncInferenceClient, AsyncRequestHandle
from .client import InferenceClient
from .handle import RequestHandle

__all__ = ["InferenceClient", "RequestHandle", "AsyncInferenceClient", "AsyncRequestHandle"]
