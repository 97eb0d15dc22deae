"""A `DynamicEngine`'s per-run state over its runner and KV pool: what `reset_bookkeeping` makes
fresh when the engine is built and again after its warm-up, so the first real request sees an
engine with no history.

Owns: building the block allocator, the host tier's index, the scheduler, the sampler, the text
stage, the request table and counters, the steps in flight, the speculative decoder, and the
engine's async-scheduling and pipeline-depth decisions. Nothing here runs a step; the runner,
its KV pool and the draw graphs are kept.
To extend: a new piece of per-run engine state is made here, next to its kin.
"""

from __future__ import annotations

import itertools
import logging
import time

import torch

from infer_cluster.worker.engine.inflight import InFlightSteps
from infer_cluster.worker.sampling.sampler import Sampler
from infer_cluster.worker.sched.block_allocator import BlockAllocator
from infer_cluster.worker.sched.host_tier import HostTier
from infer_cluster.worker.sched.scheduler import Scheduler
from infer_cluster.worker.spec_decode.chain import VerifyChain, chain_enabled
from infer_cluster.worker.spec_decode.decoder import build_spec_decoder
from infer_cluster.worker.text.text_stage import TextStage

log = logging.getLogger(__name__)


def reset_bookkeeping(engine) -> None:
    """Fresh scheduler, block table, sampler and counters for `engine`, over the same runner and
    KV pool."""
    config, runner = engine.config, engine.runner
    engine.allocator = BlockAllocator(runner.num_kv_blocks, config.block_size, config.enable_prefix_caching)
    num_host_blocks = getattr(runner, "num_host_blocks", 0)
    engine.host_tier = HostTier(num_host_blocks) if num_host_blocks else None
    engine.scheduler = Scheduler(engine.allocator, config.max_num_seqs, config.max_num_batched_tokens,
                                 engine.max_model_len, engine.host_tier,
                                 getattr(runner, "loads_landed", None), getattr(runner, "wait_load", None))
    # The sampler's random numbers are Philox keyed by (seed, step) and made on the host
    # (a few per row); this CPU generator only draws the keys of unseeded rows.
    engine.sampler = Sampler(torch.Generator().manual_seed(config.seed), engine.draw_graphs)
    if engine.text is not None:
        engine.text = TextStage(engine.tokenizer, engine.byte_table)
    engine._requests = {}  # every request whose final delta is not out yet
    engine._pending = []  # final deltas of aborted / failed requests
    engine._arrivals = itertools.count()
    engine._num_generated = 0
    engine._phase_seconds = {}
    engine._started = time.monotonic()
    engine._inflight = InFlightSteps()
    # Live requests whose next draw needs their last id on the host (no_repeat_ngram_size,
    # structured outputs): with async scheduling their step's draw waits for the step before
    # (the forward does not); without, every step is synchronous anyway.
    engine._sync_ids = set()
    # Speculative decoding (worker/spec_decode/): None when off; its verify steps are synchronous.
    engine.spec_decoder = build_spec_decoder(config.speculative_config, engine.max_model_len,
                                             engine.draft_runner)
    engine.scheduler.speculating = engine.spec_decoder is not None
    if engine.spec_decoder is not None:
        sc = config.speculative_config
        log.info("speculative decoding: %s, %d proposals a row%s", sc.method,
                 sc.num_speculative_tokens, f", draft {sc.model}" if sc.method == "draft_model" else "")
    mode = config.async_scheduling  # auto: on for CUDA (every runner fills pending rows on the device)
    engine.async_scheduling = bool(runner.device.type == "cuda" if mode == "auto" else mode)
    engine.pipeline_depth = getattr(runner, "pipeline_depth", 1)  # micro-batches in flight
    engine.spec_chain = build_chain(engine)


def build_chain(engine):
    """The engine's `VerifyChain` (worker/spec_decode/chain.py), or None: it serves prompt
    lookup on a single-rank runner with async scheduling and no micro-batches."""
    decoder, runner = engine.spec_decoder, engine.runner
    if (decoder is None or decoder.config.method != "ngram" or not engine.async_scheduling
            or engine.pipeline_depth != 1 or not getattr(runner, "chains_verify", False) or not chain_enabled()):
        return None
    sc = decoder.config
    # a chained step gives each request at least two rows: at most max_rows // 2 requests
    slots = min(decoder.max_rows // 2, engine.config.max_num_seqs)
    return VerifyChain(sc.num_speculative_tokens, sc.prompt_lookup_min, sc.prompt_lookup_max, slots,
                       engine.max_model_len, engine.config.block_size, runner.device)
