"""The CUDA graphs a single-rank `ModelRunner` captures over its KV pool.

Owns: `capture_graph_set`, which captures, in one memory pool,
- the decode graphs (worker/runner/cuda_graphs.py), with greedy variants up to
  `INFER_CLUSTER_GREEDY_GRAPH_MAX` rows (`greedy_graph_max`);
- for a speculating engine, the verify graphs: decode graphs of up to `verify_max_rows()`
  (48) rows whose attention reads the step's runs (`row_span`), each with its greedy variant. A verify step runs as decode rows,
  one a position (worker/spec_decode/verify.py `decode_shaped`); every row of a request has its
  block table, so decode attention reads that request's KV once per chunk of its rows instead of
  once per row, with splits planned for the chunks (kernels/attention_decode_triton.py). Plain
  decode steps keep the plain graphs and split plans. Past that ladder, greedy-only sizes up to
  twice the decode batch (`verify_greedy_sizes`): a verify step of plain greedy rows at a large
  batch (one proposal a row, workload A at 256 requests) replays one of those instead of running
  as a mixed step: on the H200 (Qwen3-0.6B shape, batch 256, ~385 positions) ~10 ms against
  40 ms mixed and 22-33 ms as eager decode rows, where a plain decode step took 5.9 ms. Only ids
  come out of them (logits for 512 rows of a 152k vocabulary would hold 155 MB).
  `INFER_CLUSTER_VERIFY_RUNS=0` captures none (verify steps then replay the plain graphs, each
  row reading its own KV);
- the mixed-step graphs (worker/runner/mixed_graphs.py).
Every graph bakes in the KV tensors' addresses, so a new pool needs a new set. A tensor-parallel
shard captures its own ladder in lock step with the other ranks (worker/distributed/shard.py).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from infer_cluster.kernels.dispatch import env_switch
from infer_cluster.worker.config import EngineConfig, env_count
from infer_cluster.worker.runner.cuda_graphs import DecodeGraphs
from infer_cluster.worker.runner.mixed_graphs import MixedGraphs, build_mixed_graphs

# The largest decode batch whose graph also has a greedy variant (the split argmax captured after
# the LM head, so an all-greedy step launches no argmax of its own); 0 turns it off. The default
# covers every decode size (at most 512 rows): at 256 rows the eager argmax's two launches and
# three allocations took 0.1-0.2 ms of host time a step on the H200's host, and with it a
# workload-A launch phase of 0.85 s against 0.53-0.61 s (int8 KV, 2026-12-01).
GREEDY_GRAPH_ENV = "INFER_CLUSTER_GREEDY_GRAPH_MAX"
GREEDY_GRAPH_MAX_DEFAULT = 512


def greedy_graph_max() -> int:
    """`INFER_CLUSTER_GREEDY_GRAPH_MAX` (the default when unset); a `ConfigError` names a bad value."""
    return env_count(GREEDY_GRAPH_ENV, GREEDY_GRAPH_MAX_DEFAULT, "sequences")


def verify_runs_enabled() -> bool:
    """False when `INFER_CLUSTER_VERIFY_RUNS=0`: a speculating engine captures no verify graphs,
    and its verify steps replay the plain decode graphs, each row reading its own KV (the A/B of
    `row_span`: bench/spec_decode.py --runs on on_rowwise)."""
    return env_switch("INFER_CLUSTER_VERIFY_RUNS")


# Greedy-only verify sizes past the verify ladder: few, since such a step is rare (the governor
# tries and explores it; worker/spec_decode/governor.py) and pads to the next size.
VERIFY_GREEDY_LADDER = (64, 96, 128, 192, 256, 384, 512, 768, 1024)


def verify_greedy_sizes(ladder_max: int, max_seqs: int) -> list[int]:
    """The greedy-only verify sizes past `ladder_max` (`verify_max_rows`): those of
    `VERIFY_GREEDY_LADDER` up to twice `max_seqs` (a row and one proposal each, `row_limit`'s
    least), and that bound itself."""
    top = 2 * max_seqs
    if top <= ladder_max:
        return []
    return sorted({s for s in VERIFY_GREEDY_LADDER if ladder_max < s < top} | {top})


def capture_graph_set(forward_logits: Callable, greedy_forward: Callable, forward_sampled: Callable,
                      kv_caches, config: EngineConfig, max_model_len: int, device: torch.device,
                      copy_engine_busy: bool, verify_runs: bool
                      ) -> tuple[DecodeGraphs, Optional[DecodeGraphs], Optional[MixedGraphs]]:
    """(decode graphs, verify graphs or None, mixed-step graphs or None) over `kv_caches`.
    `copy_engine_busy`: a host KV tier's loads keep the copy engines busy (graph_inputs.py);
    `verify_runs`: capture the verify graphs (a speculating engine, runs enabled)."""
    max_blocks = -(-max_model_len // config.block_size)
    max_seqs = min(config.max_num_seqs, 512)
    greedy_max = greedy_graph_max()
    greedy = dict(greedy_forward=greedy_forward if greedy_max else None, greedy_max_batch=greedy_max)
    decode = DecodeGraphs(forward_logits, kv_caches, max_seqs, max_blocks, device, **greedy)
    verify = None
    if verify_runs:
        from infer_cluster.worker.spec_decode.verify import verify_max_rows
        # every verify size greedy (48 rows at most by default): an all-greedy verify step then
        # launches no argmax after its replay (two Triton launches, ~0.15 ms of host on the H200)
        rows = verify_max_rows()
        wide = verify_greedy_sizes(rows, max_seqs) if greedy_max else []
        verify = DecodeGraphs(forward_logits, kv_caches, rows, max_blocks, device, runs=True, pool=decode.pool,
                              greedy_only=wide,
                              **dict(greedy, greedy_max_batch=max([rows, greedy_max, *wide])))
    for graphs in (decode, verify):  # decode steps are written straight into the graphs' inputs
        if graphs is not None:
            graphs.inputs.open_host(copy_engine_busy=copy_engine_busy)
    mixed = build_mixed_graphs(forward_sampled, kv_caches,
                               min(config.graph_max_tokens, config.max_num_batched_tokens),
                               max_seqs, max_blocks, device, decode.pool)
    return decode, verify, mixed
