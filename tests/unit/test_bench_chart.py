"""bench/chart.py: the roofline shares of a tiny headline file, a fresh throughput result replacing
its headline figure, and a PNG written (skipped without matplotlib)."""

import json

import pytest

from bench import chart


def _headline(tmp_path):
    figs = [
        {"bench": "roofline", "device": "H200", "gpus": 1, "model": "qwen3-0.6b-shape", "value": 1000.0},
        {"bench": "throughput", "device": "H200", "gpus": 1, "model": "qwen3-0.6b-shape", "layout": "T=1",
         "kind": "greedy", "value": 700.0},
        {"bench": "throughput", "device": "H200", "gpus": 2, "model": "qwen3-0.6b-shape", "layout": "T=2",
         "kind": "sampled", "value": 900.0},
        {"bench": "throughput", "device": "H100", "gpus": 1, "model": "qwen3-0.6b-shape", "layout": "T=1",
         "kind": "greedy", "value": 500.0},  # no H100 roofline: not drawn
    ]
    path = tmp_path / "headline.json"
    path.write_text(json.dumps({"figures": figs}))
    return path


def test_shares_read_a_layout_against_its_gpus(tmp_path):
    panels = chart.shares(chart.load_headline(_headline(tmp_path)))
    assert list(panels) == [("H200", "qwen3-0.6b-shape")]
    rows = {(layout, kind): share for layout, kind, share, _ in panels[("H200", "qwen3-0.6b-shape")]["rows"]}
    assert rows == {("T=1", "greedy"): pytest.approx(0.7), ("T=2", "sampled"): pytest.approx(0.45)}


def test_fresh_throughput_json_replaces_its_headline_figure(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "a.json").write_text(json.dumps({
        "bench": "throughput", "model": "qwen3-0.6b-shape",
        "workload": {"num_seqs": 256, "prompt_len": [100, 1024], "output_len": [100, 1024], "seed": 0},
        "layout": {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "kv_cache_dtype": "auto"},
        "run": {"date": "2026-12-01", "commit": "abc1234", "device_name": "NVIDIA H200"},
        "ours": {"sampling": {"greedy": {"tokens_per_s": 800.0}}}}))
    (results / "held_out.json").write_text(json.dumps({
        "bench": "throughput", "model": "qwen3-0.6b-shape",
        "workload": {"num_seqs": 256, "prompt_len": [100, 1024], "output_len": [100, 1024], "seed": 1},
        "layout": {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "kv_cache_dtype": "auto"},
        "ours": {"sampling": {"greedy": {"tokens_per_s": 900.0}}}}))
    (results / "other_workload.json").write_text(json.dumps({
        "bench": "throughput", "model": "qwen3-0.6b-shape", "workload": {"num_seqs": 4},
        "ours": {"sampling": {"greedy": {"tokens_per_s": 1.0}}}}))
    (results / "not_json.json").write_text("{")
    fresh = chart.figures_from_results(str(results))
    assert [(f["device"], f["layout"], f["kind"], f["value"]) for f in fresh] == [("H200", "T=1", "greedy", 800.0)]
    merged = chart.merge(chart.load_headline(_headline(tmp_path)), fresh)
    greedy = [f for f in merged if f.get("kind") == "greedy" and f["device"] == "H200"]
    assert [(f["value"], f["commit"]) for f in greedy] == [(800.0, "abc1234")]


def test_draw_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "throughput.png"
    assert chart.main(["--headline", str(_headline(tmp_path)), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_roofline_json_of_workload_a_only_bf16_seed_0(tmp_path):
    def roofline(**extra):
        w = {"num_seqs": 256, "prompt_len": [100, 1024], "output_len": [100, 1024], "seed": extra.pop("seed", 0)}
        return {"bench": "roofline", "model": "qwen3-0.6b-shape", "workload": w, "ceiling_tokens_per_s": 1.0,
                "run": {"device_name": "NVIDIA H200"}, **extra}

    for name, d in {"a": roofline(), "held_out": roofline(seed=1), "int8": roofline(kv_cache_dtype="int8")}.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(d))
    fresh = chart.figures_from_results(str(tmp_path))
    assert [(f["bench"], f["device"], f["value"]) for f in fresh] == [("roofline", "H200", 1.0)]
