"""EngineConfig and SamplingParams validation: bad values fail with a message naming the field."""

import math

import pytest

from infer_cluster.protocol import InvalidRequestError, SamplingParams
from infer_cluster.protocol.errors import ERRORS_BY_CODE, OutOfMemoryError, error_from_code
from infer_cluster.worker.config import ConfigError, EngineConfig

# -- SamplingParams --------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    (dict(temperature=-0.1), "temperature must be >= 0.0, got -0.1"),
    (dict(temperature=math.inf), "temperature must be finite"),
    (dict(temperature=math.nan), "temperature must be finite"),
    (dict(temperature="hot"), "temperature must be a number, got 'hot'"),
    (dict(temperature=True), "temperature must be a number, got True"),
    (dict(top_p=0.0), "top_p must be > 0.0, got 0.0"),
    (dict(top_p=1.5), "top_p must be <= 1.0, got 1.5"),
    (dict(top_k=-2), "top_k must be >= -1, got -2"),
    (dict(top_k=2.0), "top_k must be an integer"),
    (dict(min_p=1.1), "min_p must be <= 1.0"),
    (dict(max_tokens=0), "max_tokens must be >= 1, got 0"),
    (dict(max_tokens=-5), "max_tokens must be >= 1, got -5"),
    (dict(max_tokens=None), "max_tokens must be an integer, got None"),
    (dict(min_tokens=-1), "min_tokens must be >= 0"),
    (dict(min_tokens=5, max_tokens=4), r"min_tokens \(5\) must be <= max_tokens \(4\)"),
    (dict(stop=[""]), "each stop string must have 1..512 characters"),
    (dict(stop=["x" * 513]), "each stop string must have 1..512 characters"),
    (dict(stop=[1]), "stop must be a string or a list of strings"),
    (dict(stop=["s"] * 17), "stop has 17 strings; at most 16"),
    (dict(stop_token_ids=5), "stop_token_ids must be a list of integers"),
    (dict(stop_token_ids=[-1]), r"stop_token_ids\[\] must be >= 0"),
    (dict(ignore_eos="yes"), "ignore_eos must be true or false"),
    (dict(seed=-1), "seed must be >= 0"),
    (dict(seed=2**63), "seed must be <= "),
    (dict(repetition_penalty=0.0), "repetition_penalty must be > 0.0"),
    (dict(presence_penalty=2.5), "presence_penalty must be <= 2.0"),
    (dict(frequency_penalty=-3), "frequency_penalty must be >= -2.0"),
    (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size must be >= 0"),
    (dict(logprobs=21), "logprobs must be <= 20"),
    (dict(logprobs=-1), "logprobs must be >= 0"),
    # past the wire's 32-bit range (msgpack cannot even carry 2**70)
    (dict(max_tokens=2**70), "max_tokens must be <= 2147483647"),
    (dict(top_k=2**31), "top_k must be <= 2147483647"),
    (dict(min_tokens=2**40), "min_tokens must be <= 2147483647"),
    (dict(stop_token_ids=[2**70]), r"stop_token_ids\[\] must be <= 2147483647"),
    (dict(no_repeat_ngram_size=2**40), "no_repeat_ngram_size must be <= 2147483647"),
])
def test_sampling_params_reject_bad_values(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message) as info:
        SamplingParams(**kwargs)
    assert isinstance(info.value, ValueError)
    assert info.value.code == "invalid_request"
    assert info.value.to_dict() == {"code": "invalid_request", "message": str(info.value)}


def test_sampling_params_accept_good_values():
    p = SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, min_p=0.0, max_tokens=1, min_tokens=1,
                       stop="END", stop_token_ids=(3, 4), seed=0, logprobs=0,
                       presence_penalty=-2.0, frequency_penalty=2.0, repetition_penalty=1.2)
    assert p.top_k == 0  # -1 means "no top-k", stored as 0
    assert p.stop == ["END"] and p.stop_token_ids == [3, 4]
    assert p.is_greedy and p.has_penalties
    q = SamplingParams(temperature=0.7, top_p=0.01, top_k=40, max_tokens=4096, logprobs=20)
    assert not q.is_greedy and not q.has_penalties
    assert SamplingParams(top_k=1).is_greedy
    assert SamplingParams(temperature=5).temperature == 5


def test_sampling_params_from_dict():
    p = SamplingParams.from_dict({"temperature": 0.5, "max_tokens": 7, "stop": ["a", "b"]})
    assert (p.temperature, p.max_tokens, p.stop) == (0.5, 7, ["a", "b"])
    assert SamplingParams.from_dict(None) == SamplingParams()
    assert SamplingParams.from_dict(p.to_dict()) == p


def test_sampling_params_from_dict_rejects_unknown_keys():
    with pytest.raises(InvalidRequestError, match="unknown sampling parameter.*max_token, temprature"):
        SamplingParams.from_dict({"temprature": 0.5, "max_token": 3})
    with pytest.raises(InvalidRequestError, match="sampling params must be a map, got list"):
        SamplingParams.from_dict([("temperature", 1.0)])
    with pytest.raises(InvalidRequestError, match="unknown sampling parameter"):
        SamplingParams.from_dict({1: 2})
    with pytest.raises(InvalidRequestError, match="top_p must be > 0.0"):
        SamplingParams.from_dict({"top_p": 0})


# -- EngineConfig ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    (dict(model=""), "model must be a model name or directory"),
    (dict(device="tpu"), "device must be one of auto, cpu, cuda, got 'tpu'"),
    (dict(dtype="float64"), "dtype must be one of auto, float32, float16, bfloat16, got 'float64'"),
    (dict(load_format="pt"), "load_format must be one of auto, dummy"),
    (dict(block_size=12), "block_size must be a power of two, got 12"),
    (dict(block_size=0), "block_size must be a positive integer, got 0"),
    (dict(block_size=-16), "block_size must be a positive integer"),
    (dict(block_size=16.0), "block_size must be a positive integer"),
    (dict(num_kv_blocks=0), "num_kv_blocks must be a positive integer"),
    (dict(gpu_memory_utilization=0.0), r"gpu_memory_utilization must be in \(0, 1\]"),
    (dict(gpu_memory_utilization=1.01), "gpu_memory_utilization must be in"),
    (dict(max_num_seqs=0), "max_num_seqs must be a positive integer"),
    (dict(max_num_seqs=True), "max_num_seqs must be a positive integer, got True"),
    (dict(max_num_batched_tokens=-1), "max_num_batched_tokens must be a positive integer"),
    (dict(max_model_len=0), "max_model_len must be a positive integer"),
    (dict(seed=-1), "seed must be a non-negative integer"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be a positive integer"),
    (dict(pipeline_parallel_size=0), "pipeline_parallel_size must be a positive integer"),
    (dict(tensor_parallel_size=2, device_ids=[0]),
     r"device_ids lists 1 devices but tensor_parallel_size x pipeline_parallel_size = 2"),
    (dict(tensor_parallel_size=2, pipeline_parallel_size=2, device_ids=[0, 1, 2]),
     "device_ids lists 3 devices .* = 4"),
    (dict(device_ids=[-1]), "device_ids must be non-negative integers"),
    (dict(cpu_kv_cache_gib=0), "cpu_kv_cache_gib must be > 0"),
    (dict(kv_cache_dtype="fp8"), "kv_cache_dtype must be one of auto, int8, got 'fp8'"),
    (dict(async_scheduling="yes"), "async_scheduling must be true, false or 'auto', got 'yes'"),
    (dict(pipeline_microbatches="yes", pipeline_parallel_size=2),
     "pipeline_microbatches must be one of auto, on, off, got 'yes'"),
    (dict(pipeline_microbatches=2, pipeline_parallel_size=2), "pipeline_microbatches must be one of"),
    (dict(pipeline_microbatches="on"), "pipeline_microbatches 'on' needs pipeline_parallel_size > 1"),
])
def test_engine_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        EngineConfig(**kwargs)
    assert isinstance(info.value, InvalidRequestError)
    assert info.value.code == "invalid_config"


def test_engine_config_accepts_good_values():
    c = EngineConfig()
    assert (c.block_size, c.device, c.dtype, c.world_size) == (16, "auto", "auto", 1)
    assert c.kv_cache_dtype == "auto" and EngineConfig(kv_cache_dtype="int8").kv_cache_dtype == "int8"
    for bs in (1, 2, 8, 32, 256):
        assert EngineConfig(block_size=bs).block_size == bs
    c = EngineConfig(device="cuda", dtype="bfloat16", tensor_parallel_size=2,
                     pipeline_parallel_size=2, device_ids=[3, 2, 1, 0], num_kv_blocks=100,
                     max_model_len=4096, gpu_memory_utilization=1.0, load_format="dummy")
    assert c.world_size == 4 and c.device_ids == [3, 2, 1, 0]
    # device_ids from a CLI string.
    assert EngineConfig(tensor_parallel_size=2, device_ids="0, 1").device_ids == [0, 1]
    with pytest.raises(ConfigError, match="device_ids lists 3 devices"):
        EngineConfig(tensor_parallel_size=2, device_ids="0,1,2")


def test_pipeline_microbatches_depth():
    """auto = on where stages replay CUDA graphs (CUDA, not enforce_eager), else off; the depth
    (steps in flight) is P with micro-batches on, else 1."""
    assert EngineConfig().microbatch_depth == 1
    assert EngineConfig(pipeline_microbatches="off").microbatch_depth == 1
    assert EngineConfig(pipeline_parallel_size=2, device="cpu").microbatch_depth == 1
    assert EngineConfig(pipeline_parallel_size=2, device="cuda").microbatch_depth == 2
    assert EngineConfig(pipeline_parallel_size=3, device="cuda", enforce_eager=True).microbatch_depth == 1
    assert EngineConfig(pipeline_parallel_size=2, device="cuda", pipeline_microbatches="off").microbatch_depth == 1
    assert EngineConfig(pipeline_parallel_size=2, pipeline_microbatches="on").microbatch_depth == 2
    assert EngineConfig(pipeline_parallel_size=2, tensor_parallel_size=2,
                        pipeline_microbatches="on").microbatch_depth == 2
    assert EngineConfig(pipeline_parallel_size=2, pipeline_microbatches="off").microbatch_depth == 1
    assert EngineConfig(pipeline_parallel_size=2, pipeline_microbatches=True).pipeline_microbatches == "on"
    assert EngineConfig(pipeline_microbatches=False).pipeline_microbatches == "off"


def test_engine_config_replace_revalidates():
    c = EngineConfig(block_size=8)
    assert c.replace(max_num_seqs=4).max_num_seqs == 4
    assert c.replace(max_num_seqs=4).block_size == 8
    with pytest.raises(ConfigError, match="block_size must be a power of two"):
        c.replace(block_size=24)
    assert "block_size" in EngineConfig.field_names()
    assert "device_ids" in EngineConfig.field_names()


# -- errors ----------------------------------------------------------------------------------------

def test_errors_round_trip_by_code():
    err = error_from_code("out_of_memory", "too big")
    assert type(err) is OutOfMemoryError and isinstance(err, MemoryError)
    assert err.to_dict() == {"code": "out_of_memory", "message": "too big"}
    assert type(error_from_code("invalid_request", "x")) is InvalidRequestError
    assert type(error_from_code("no-such-code", "x")).__name__ == "InferClusterError"


def test_config_error_round_trips_by_code():
    assert ERRORS_BY_CODE.get("invalid_config") is ConfigError
    assert type(error_from_code("invalid_config", "x")) is ConfigError


def test_cpu_replicas_leave_one_core_for_the_coordinator_and_gateway():
    import os

    from infer_cluster.cli import _replica_envs, cpu_threads_per_replica
    assert cpu_threads_per_replica(16, 1) == 15
    assert cpu_threads_per_replica(16, 3) == 5
    assert cpu_threads_per_replica(2, 1) == 1
    assert cpu_threads_per_replica(1, 1) == 1 and cpu_threads_per_replica(2, 4) == 1
    envs = _replica_envs({}, 2, {"device": "cpu"})
    assert [e["OMP_NUM_THREADS"] for e in envs] == [str(cpu_threads_per_replica(
        os.cpu_count() or 1, 2))] * 2
    assert _replica_envs({"OMP_NUM_THREADS": "7"}, 1, {"device": "cpu"})[0]["OMP_NUM_THREADS"] == "7"


def test_graph_max_tokens_buckets_and_validation():
    from infer_cluster.protocol.errors import ConfigError
    from infer_cluster.worker.config import EngineConfig
    from infer_cluster.worker.runner.mixed_graphs import token_buckets

    assert token_buckets(512) == [16, 32, 64, 128, 256, 512]
    assert token_buckets(2048) == [16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048]
    assert token_buckets(1100) == [16, 32, 64, 128, 256, 512, 768, 1024, 1100]
    assert token_buckets(100) == [16, 32, 64, 100]
    assert token_buckets(16) == [16] and token_buckets(15) == [] and token_buckets(0) == []
    assert EngineConfig(graph_max_tokens=0).graph_max_tokens == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="graph_max_tokens"):
            EngineConfig(graph_max_tokens=bad)


def test_model_help_names_every_embedded_model():
    import dataclasses

    from infer_cluster.worker.loading.embedded import EMBEDDED_MODELS

    help_text = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(EngineConfig)}["model"]
    missing = [name for name in EMBEDDED_MODELS if name not in help_text]
    assert not missing, f"--model's help does not name {missing}"
