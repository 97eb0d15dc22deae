"""Wire protocol and shared request types. Never imports torch.

Owns: `SamplingParams`, request status / finish reasons / deltas / outputs, typed errors, and
(in `kinds`, `messages`, `codec`) the ZMQ message structs with their msgpack encoding.
"""

from .errors import (ConfigError, EngineError, InferClusterError, InvalidRequestError, ModelNotFoundError,
                     NoReplicaError, OutOfMemoryError, OverloadedError, ProtocolError,
                     RequestTimeoutError, UnreachableError, error_from_code)
from .outputs import (FinishReason, RequestDelta, RequestMetrics, RequestOutput, RequestStatus,
                      REQUEST_TRANSITIONS)
from .sampling_params import SamplingParams
from .structured import StructuredOutputsParams

__all__ = [
    "SamplingParams", "StructuredOutputsParams", "FinishReason", "RequestDelta", "RequestMetrics", "RequestOutput", "RequestStatus",
    "REQUEST_TRANSITIONS", "InferClusterError", "InvalidRequestError", "ModelNotFoundError",
    "OutOfMemoryError", "ProtocolError", "OverloadedError", "NoReplicaError",
    "RequestTimeoutError", "UnreachableError", "EngineError", "ConfigError", "error_from_code",
]
