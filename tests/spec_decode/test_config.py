"""`speculative_config`: vLLM's shape on EngineConfig, the CLI flag, errors that name the field,
and the engine settings it is refused with (one line naming both)."""

import json

import pytest
from click.testing import CliRunner

from infer_cluster.worker.config import ConfigError, EngineConfig
from infer_cluster.worker.spec_decode.config import SpeculativeConfig

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


def test_dict_json_and_instance_give_the_same_config():
    want = SpeculativeConfig("ngram", 3, 2, 5)
    assert EngineConfig(speculative_config=NGRAM).speculative_config == want
    assert EngineConfig(speculative_config=json.dumps(NGRAM)).speculative_config == want
    assert EngineConfig(speculative_config=want).speculative_config == want
    assert EngineConfig(speculative_config=NGRAM).replace(seed=3).speculative_config == want
    assert EngineConfig().speculative_config is None
    assert SpeculativeConfig.parse(want.to_json()) == want
    draft = SpeculativeConfig("draft_model", 3, model="tiny-random")
    assert EngineConfig(speculative_config=json.loads(draft.to_json())).speculative_config == draft


@pytest.mark.parametrize("value,message", [
    (dict(NGRAM, num_speculative_tokens=0), "speculative_config.num_speculative_tokens must be 1..32, got 0"),
    (dict(NGRAM, num_speculative_tokens=33), "speculative_config.num_speculative_tokens must be 1..32"),
    (dict(NGRAM, num_speculative_tokens=True), "speculative_config.num_speculative_tokens must be 1..32"),
    (dict(NGRAM, prompt_lookup_min=0), "speculative_config.prompt_lookup_min must be 1..64"),
    (dict(NGRAM, prompt_lookup_max=65), "speculative_config.prompt_lookup_max must be 1..64"),
    (dict(NGRAM, prompt_lookup_min=6), r"speculative_config.prompt_lookup_min \(6\) must be <= prompt_lookup_max \(5\)"),
    (dict(NGRAM, method="eagle"), "speculative_config.method must be one of ngram, draft_model"),
    ({"num_speculative_tokens": 3}, "speculative_config.method is required"),
    (dict(NGRAM, lookahead=2), "speculative_config has unknown field"),
    (dict(NGRAM, model="x"), "speculative_config.model is for method 'draft_model' only"),
    ({"method": "draft_model", "num_speculative_tokens": 3},
     "speculative_config.model is required for method 'draft_model'"),
    ({"method": "draft_model", "model": "", "num_speculative_tokens": 3},
     "speculative_config.model is required for method 'draft_model'"),
    ("{not json", "speculative_config is not valid JSON"),
    ([1, 2], "speculative_config must be a map"),
])
def test_bad_values_name_the_field(value, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(speculative_config=value)


DRAFT = {"method": "draft_model", "model": "tiny-random", "num_speculative_tokens": 4}


@pytest.mark.parametrize("spec,settings,names", [
    (NGRAM, dict(pipeline_parallel_size=2), "pipeline_parallel_size"),
    (DRAFT, dict(pipeline_parallel_size=2), "pipeline_parallel_size"),
])
def test_combinations_not_built_are_refused_naming_both(spec, settings, names):
    with pytest.raises(ConfigError) as info:
        EngineConfig(speculative_config=spec, **settings)
    message = str(info.value)
    assert "speculative_config" in message and names in message and "\n" not in message
    EngineConfig(**settings)  # alone, each is fine


def test_allowed_combinations():
    EngineConfig(speculative_config=NGRAM, tensor_parallel_size=2)  # tests/distributed/test_spec_decode.py
    EngineConfig(speculative_config=DRAFT, tensor_parallel_size=2)  # the draft on rank 0's device
    EngineConfig(speculative_config=NGRAM, async_scheduling="auto")
    EngineConfig(speculative_config=NGRAM, async_scheduling=False)
    EngineConfig(speculative_config=NGRAM, async_scheduling=True)  # steps that do not speculate
    EngineConfig(speculative_config=NGRAM, device="cuda", enforce_eager=True)
    EngineConfig(speculative_config=NGRAM, device="cuda")  # verify steps replay mixed-step graphs
    EngineConfig(speculative_config=NGRAM, kv_offload_gib=1.0)


def test_cli_flag_reaches_the_config_and_the_replica_argv():
    from infer_cluster.cli import main
    from infer_cluster.cli_options import engine_argv
    from infer_cluster.worker.__main__ import build_parser

    args = build_parser().parse_args(["--speculative-config", json.dumps(NGRAM)])
    assert EngineConfig(speculative_config=args.speculative_config).speculative_config.prompt_lookup_max == 5
    assert engine_argv({"speculative_config": json.dumps(NGRAM)}) == ["--speculative-config", json.dumps(NGRAM)]
    bad = CliRunner().invoke(main, ["serve", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 99}'])
    assert bad.exit_code == 1
    assert "speculative_config.num_speculative_tokens must be 1..32" in bad.output


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
def test_disable_by_batch_size_is_checked(bad):
    with pytest.raises(ConfigError, match="speculative_config.disable_by_batch_size"):
        SpeculativeConfig.parse({**NGRAM, "disable_by_batch_size": bad})


def test_disable_by_batch_size_round_trips_to_the_replica_flag():
    sc = SpeculativeConfig.parse({**NGRAM, "disable_by_batch_size": 32})
    assert sc.disable_by_batch_size == 32
    assert SpeculativeConfig.parse(sc.to_json()) == sc
