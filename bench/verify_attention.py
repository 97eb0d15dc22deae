"""Decode attention over a verify step's rows: each request's positions read its KV once per
chunk of rows (`row_span` runs) against once per row, timed as CUDA-graph replays.

A speculating engine runs a verify step as a decode step of one row a position
(worker/spec_decode/verify.py `decode_shaped`): batch 1 at k = 15 is 16 rows of one request,
batch 8 at k = 5 is 48 rows of 8. Every row of a request has the same block table and a context
one longer than the row before, so reading the KV row by row reads it k + 1 times. With runs,
one program serves up to 16 // GROUP rows (kernels/attention_decode_triton.py).

Reports per case: ms a launch (kernel and reduce, one replay of 100 launches / 100) with and
without runs, the ratio, plain decode of one row a request for scale, and the max difference
between the two outputs. Shapes: SmolLM2-135M (9 / 3 heads of 64) and the Qwen3-0.6B shape
(16 / 8 of 128), bf16 or int8 KV, contexts of ~1.3k tokens.

    python bench/verify_attention.py [--kv int8] [--out bench/results/verify_attention.json]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.report import run_info, write_json  # noqa: E402

SHAPES = {"smollm2-135m": (9, 3, 64), "qwen3-0.6b": (16, 8, 128)}
CASES = [("batch 1, k=15", [16]), ("batch 1, k=4", [5]), ("batch 8, k=5", [6] * 8),
         ("batch 16, k=2", [3] * 16)]


def _batch(runs, ctx, heads, kv_heads, dim, block, dtype, device, max_model_len):
    """A verify step's rows: request i's `runs[i]` rows end at ctx + 37 i; block tables as
    wide as `max_model_len` needs (the graphs' tables are; the split count follows the width)."""
    import torch
    width = -(-max(max_model_len, ctx + 37 * len(runs) + 64) // block)
    blocks = torch.randperm(len(runs) * width, device=device).view(len(runs), width).int()
    k = torch.randn(len(runs) * width, block, kv_heads, dim, device=device).to(dtype)
    v = torch.randn_like(k)
    owner = torch.tensor([i for i, n in enumerate(runs) for _ in range(n)], device=device)
    lens = torch.tensor([ctx + 37 * i - n + 1 + j for i, n in enumerate(runs) for j in range(n)],
                        dtype=torch.int32, device=device)
    rows = int(owner.numel())
    spans = [x for n in runs for x in [n] + [-j for j in range(1, n)]]
    q = torch.randn(rows, heads, dim, device=device, dtype=torch.bfloat16)
    return (q, k, v, blocks[owner].contiguous(), torch.arange(rows + 1, dtype=torch.int32, device=device),
            lens, torch.tensor(spans, dtype=torch.int32, device=device))


def _time(fn) -> float:
    """ms a call, the best replay of one CUDA graph of 100 calls (the engine replays graphs)."""
    from bench.graph_timing import best_replay_s
    return best_replay_s(lambda i: fn(), calls=100, replays=5) * 1e3


def _variant(name: str) -> dict:
    """The decode config of a `--variants` entry."""
    parts = name.split(":")
    cfg = dict(run_block_g=int(parts[0][1:]))
    for p in parts[1:]:
        if p == "rows":
            cfg["runs_split"] = "rows"
        elif p.startswith("pps"):
            cfg["runs_programs_per_sm"] = int(p[3:])
        elif p.startswith("mp"):
            cfg["min_partition"] = int(p[2:])
        else:
            raise SystemExit(f"unknown variant part {p!r} in {name!r}")
    return cfg


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kv", choices=["bf16", "int8"], default="bf16")
    ap.add_argument("--ctx", type=int, default=1300)
    ap.add_argument("--max-model-len", type=int, default=8192,
                    help="block-table width in tokens, as the engine's graphs have it (SmolLM2: 8,192)")
    ap.add_argument("--variants", nargs="+", default=["g16"],
                    help="launches with runs to time, each 'g<query rows a program>' (config "
                         "run_block_g) and optionally ':rows' (splits planned for every row, not the "
                         "chunks), ':pps<N>' (runs_programs_per_sm), ':mp<N>' (min_partition), e.g. g16 "
                         "g16:pps2 g16:rows")
    ap.add_argument("--out", default="bench/results/verify_attention.json")
    args = ap.parse_args(argv)
    import torch

    from infer_cluster.kernels.attention_triton import decode_attention
    from infer_cluster.kernels.kv_append import quantize_int8_ref
    if not torch.cuda.is_available():
        sys.exit("bench/verify_attention.py needs a CUDA device")
    device = torch.device("cuda")
    rows_out = []
    for shape, (heads, kv_heads, dim) in SHAPES.items():
        for name, runs in CASES:
            q, k, v, tables, qsl, lens, span = _batch(runs, args.ctx, heads, kv_heads, dim, 16,
                                                      torch.bfloat16, device, args.max_model_len)
            scales = {}
            if args.kv == "int8":
                (k, ks), (v, vs) = (quantize_int8_ref(c) for c in (k, v))
                scales = dict(k_scale=ks.transpose(1, 2).contiguous(), v_scale=vs.transpose(1, 2).contiguous())
            modes = list(args.variants) + ["rowwise"]
            outs = {m: torch.empty_like(q) for m in modes}
            ms = {}
            for mode in modes:
                cfg = _variant(mode) if mode != "rowwise" else None
                ms[mode] = _time(lambda: decode_attention(q, k, v, tables, qsl, lens, dim ** -0.5, outs[mode],
                                                          row_span=span if cfg else None, config=cfg, **scales))
            best = min(modes[:-1], key=ms.get)
            ms["runs"], outs["runs"] = ms[best], outs[best]
            # one row a request (a plain decode step of the same requests), for scale
            firsts = torch.tensor([sum(runs[:i]) for i in range(len(runs))], device=device)
            q1, t1, l1 = q[firsts].contiguous(), tables[firsts].contiguous(), lens[firsts]
            qsl1 = torch.arange(len(runs) + 1, dtype=torch.int32, device=device)
            o1 = torch.empty_like(q1)
            ms["plain"] = _time(lambda: decode_attention(q1, k, v, t1, qsl1, l1, dim ** -0.5, o1, **scales))
            diff = (outs["runs"].float() - outs["rowwise"].float()).abs().max().item()
            row = {"shape": shape, "case": name, "rows": int(q.shape[0]), **{f"{m}_ms": t for m, t in ms.items()},
                   "best_runs": best, "rowwise_over_runs": ms["rowwise"] / ms["runs"], "max_diff": diff}
            rows_out.append(row)
            each = " ".join(f"{m} {ms[m] * 1e3:.1f}" for m in modes[:-1])
            print(f"{shape:>13} {name:>15} ({row['rows']:>2} rows): {each} us, "
                  f"rowwise {ms['rowwise'] * 1e3:6.1f} us ({row['rowwise_over_runs']:.2f}x), one row a "
                  f"request {ms['plain'] * 1e3:6.1f} us; max diff {diff:.2e}")
    result = {**run_info(), "kv": args.kv, "ctx": args.ctx, "max_model_len": args.max_model_len,
              "cases": rows_out}
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
