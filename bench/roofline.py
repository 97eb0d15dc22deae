"""Hardware ceilings for a decode-heavy workload, from measured (not datasheet) rates.

Measures device-to-device copy bandwidth (bytes read + written) and bf16 matmul rate on the
current GPU (each the best of 30 timings after half a second of warm-up), then for a model shape
and workload computes:
  - decode floor: per step, all weight bytes + the live KV bytes of the batch, over bandwidth
    (`--kv-cache-dtype int8`: a KV element is one byte, plus a float32 scale a token and KV head
    for K and for V, as the int8 cache stores them);
  - prefill floor: 2 x params x prompt tokens (+ attention FLOPs), over the matmul rate;
  - the output tokens/s ceiling of the whole workload (sum of those floors), and the
    batch-1 TPOT bound (weight bytes / bandwidth).
Over T x P GPUs (`--tensor-parallel-size`, `--pipeline-parallel-size`): each GPU holds 1/(T x P)
of the weights and KV and does that share of the FLOPs, so the workload's floors shrink by
T x P (pipeline stages busy at once, as micro-batches keep them; all-reduce and bubbles are
what the engine loses against it). A batch-1 token crosses the P stages one after another, so
its TPOT bound shrinks by T alone.
Importable (`measure_device`, `workload_ceiling`) so other benchmarks print it beside their
figures; `python bench/roofline.py --model qwen3-0.6b-shape` prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.report import run_info, write_json  # noqa: E402


def best_seconds(fn, reps: int = 30, warm_s: float = 0.5) -> float:
    """The fastest of `reps` CUDA-event timings of `fn`, after running it for `warm_s` seconds
    (a GPU fresh from idle runs its first copies at lower clocks): a ceiling is the fastest rate
    the device sustains. Shared by the benchmarks that report a share of copy bandwidth."""
    import torch

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm_s:
        fn()
        torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return min(times)


def copy_GBps(size_mib: int = 1024) -> float:
    """Device-to-device copy bandwidth, bytes read + written (`best_seconds` of one copy)."""
    import torch

    x = torch.empty(size_mib * 2**20, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    return 2 * x.numel() / best_seconds(lambda: y.copy_(x)) / 1e9


def measure_device(size_mib: int = 1024, n: int = 4096):
    import torch

    dev = torch.device("cuda")
    a = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    copy = copy_GBps(size_mib)
    t_mm = best_seconds(lambda: torch.mm(a, b))
    return {"copy_GBps": copy, "bf16_TFLOPs": 2 * n ** 3 / t_mm / 1e12,
            "device": torch.cuda.get_device_name()}


def model_numbers(model: str, kv_cache_dtype: str = "auto") -> dict:
    import torch

    from infer_cluster.worker.loading.loader import load_hf_config, resolve_model_path
    from infer_cluster.worker.models.decoder import ModelSpec
    from infer_cluster.worker.runner.context import DynamicContext

    s = ModelSpec.from_hf_config(load_hf_config(resolve_model_path(model)))
    d = s.head_dim
    attn = s.hidden_size * (s.num_heads + 2 * s.num_kv_heads) * d + s.num_heads * d * s.hidden_size
    mlp = 3 * s.hidden_size * s.intermediate_size
    layer_params = s.num_layers * (attn + mlp)
    head = s.vocab_size * s.hidden_size
    params = layer_params + head * (1 if s.tie_word_embeddings else 2)
    # per token: embedding row read is negligible; LM head is a full matmul
    matmul_params = layer_params + head
    return {"params": params, "matmul_params": matmul_params, "weight_bytes": 2 * matmul_params,
            # the cache's own accounting: bf16 K and V, or int8 codes plus a float32 scale a row
            "kv_bytes_per_token": DynamicContext.bytes_per_block(
                s.num_layers, 1, s.num_kv_heads, d, torch.int8 if kv_cache_dtype == "int8" else torch.bfloat16),
            "attn_flops_per_token_ctx": 4 * s.num_layers * s.num_heads * d}


def workload_ceiling(model: str, prompt_lens, output_lens, max_batch: int, dev: dict,
                     tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                     kv_cache_dtype: str = "auto") -> dict:
    """Tokens/s ceiling if decode ran at full bandwidth and prefill at full matmul rate, on
    T x P GPUs of `dev`'s kind."""
    m = model_numbers(model, kv_cache_dtype)
    gpus = tensor_parallel_size * pipeline_parallel_size
    bw, flops = dev["copy_GBps"] * 1e9 * gpus, dev["bf16_TFLOPs"] * 1e12 * gpus
    prefill_tokens = sum(prompt_lens)
    prefill_s = (2 * m["matmul_params"] * prefill_tokens
                 + sum(m["attn_flops_per_token_ctx"] * p * p / 2 for p in prompt_lens)) / flops
    # decode: sequences in waves of max_batch; each step reads weights once and every live KV
    decode_s = 0.0
    order = sorted(range(len(prompt_lens)), key=lambda i: i)
    for w in range(0, len(order), max_batch):
        wave = order[w:w + max_batch]
        steps = max(output_lens[i] for i in wave)
        kv_total = sum(m["kv_bytes_per_token"] * (prompt_lens[i] * min(steps, output_lens[i])
                                                  + min(steps, output_lens[i]) ** 2 / 2) for i in wave)
        decode_s += steps * m["weight_bytes"] / bw + kv_total / bw
    total_out = sum(output_lens)
    return {"prefill_floor_s": prefill_s, "decode_floor_s": decode_s,
            "ceiling_tokens_per_s": total_out / (prefill_s + decode_s),
            "tpot_bound_ms": m["weight_bytes"] / bw * pipeline_parallel_size * 1e3,
            "tensor_parallel_size": tensor_parallel_size, "pipeline_parallel_size": pipeline_parallel_size,
            "kv_cache_dtype": kv_cache_dtype, **m}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3-0.6b-shape")
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=[100, 1024])
    ap.add_argument("--output-len", type=int, nargs=2, default=[100, 1024])
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--pipeline-parallel-size", type=int, default=1)
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "int8"],
                    help="the KV cache's storage: model dtype (bf16) or int8 codes with scales")
    ap.add_argument("--seed", type=int, default=0, help="the workload's seed (throughput.py's --seed)")
    ap.add_argument("--out", default="bench/results/roofline.json")
    args = ap.parse_args(argv)
    from bench.workload import random_workload
    from infer_cluster.worker.loading.loader import load_hf_config, resolve_model_path

    vocab = load_hf_config(resolve_model_path(args.model)).vocab_size
    prompts, outs = random_workload(args.num_seqs, tuple(args.prompt_len), tuple(args.output_len), vocab,
                                    args.seed)
    dev = measure_device()
    res = {"bench": "roofline", "device": dev, "model": args.model, "run": run_info(),
           "workload": {"num_seqs": args.num_seqs, "prompt_len": args.prompt_len,
                        "output_len": args.output_len, "seed": args.seed},
           **workload_ceiling(args.model, [len(p) for p in prompts], outs, args.max_num_seqs, dev,
                              args.tensor_parallel_size, args.pipeline_parallel_size, args.kv_cache_dtype)}
    print(f"{dev['device']}: copy {dev['copy_GBps']:.0f} GB/s, bf16 matmul {dev['bf16_TFLOPs']:.0f} TFLOP/s")
    print(f"layout T={args.tensor_parallel_size} x P={args.pipeline_parallel_size}, KV cache {args.kv_cache_dtype}")
    print(f"{args.model}: {res['params'] / 1e9:.2f} B params, weights {res['weight_bytes'] / 2**30:.2f} GiB")
    print(f"prefill floor {res['prefill_floor_s']:.2f} s, decode floor {res['decode_floor_s']:.2f} s, "
          f"ceiling {res['ceiling_tokens_per_s']:.0f} output tok/s, batch-1 TPOT bound {res['tpot_bound_ms']:.3f} ms")
    write_json(args.out, res)
    return res


if __name__ == "__main__":
    main()
