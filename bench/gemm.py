"""Mid-size decode GEMMs (17-256 rows): cuBLAS against the Gluon Hopper GEMM (kernels/gemm_gluon.py).

Owns: `--sweep`, which times every candidate `GemmConfig` per (layer shape, M) against cuBLAS, and
gate_up with SiLU-and-mul fused against the better unfused path, o and down also split-K (each
timed with the add + norm after it, which sums the partials), and prints the winners as
`kernels/gemm_table.py` entries (None where the baseline stays ahead by less than `--margin`;
with `--write`, rewrites that model's rows); and the layer chain (default), which times a model's
layers of the four projections, the SiLU-and-mul and the add + norms after o and down with
cuBLAS and the SiLU kernel, and with what `kernels.gemm` picks, per M, in one CUDA graph each.
Timing: each graph launches one op per layer over that layer's own weight copy (the 50 MB L2
holds none of them across a replay, as in a decode step), PDL between the Gluon launches as in
the engine; best of several replays (bench/graph_timing.py). The sweep checks each config's
output against cuBLAS (relative max error) and drops a config that disagrees, printing it.
Without CUDA it prints a note and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]
sys.path.insert(0, _ROOT)

from bench.graph_timing import best_replay_s  # noqa: E402
from bench.report import run_info, write_json  # noqa: E402

SHAPES = {  # per model: layers and the four projections as (N, K)
    "qwen3-0.6b": (28, {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024),
                        "down": (1024, 3072)}),
    "qwen3-0.6b-tp2": (28, {"qkv": (2048, 1024), "o": (1024, 1024), "gate_up": (3072, 1024),
                            "down": (1024, 1536)}),
    "smollm2-135m": (30, {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576),
                          "down": (576, 1536)}),
    "llama-3-8b-tp2": (32, {"qkv": (3072, 4096), "o": (4096, 2048), "gate_up": (14336, 4096),
                            "down": (4096, 7168)}),
    "llama-3-8b": (32, {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                        "down": (4096, 14336)}),
}
_SMEM = 220 * 1024  # a program's shared memory budget (228 KB a SM, a little reserved)


# The projections whose next op is an add + norm (kernels.norm.add_rms_norm), which can sum
# split-K partials: their cells also sweep splits, and time the GEMM with that add + norm after it.
SPLIT_OK = ("o", "down")
_SPLITS = (2, 3, 4, 6, 8)


def candidates(m: int, n: int, k: int, silu: bool = False, split: bool = False):
    """Configs for a (M, N, K) cell; with `silu`, N is the gate/up rows (output N / 2); with
    `split`, also K split 2-8 ways (a split's K steps at least its stages)."""
    from infer_cluster.kernels.gemm_gluon import GemmConfig
    out = []
    n_out = n // 2 if silu else n
    for bn, bk, stages in itertools.product((64, 128, 256), (64, 128), (3, 4, 5, 6, 8)):
        cfg = GemmConfig(block_n=bn, block_k=bk, stages=stages)
        if cfg.fits(m, n_out, k) and cfg.shared_bytes(silu) <= _SMEM and k // bk >= 2:
            out.append(cfg)
    if split:
        for bn, bk, stages, splits in itertools.product((64, 128), (64, 128), (2, 3, 4, 6), _SPLITS):
            cfg = GemmConfig(block_n=bn, block_k=bk, stages=stages, splits=splits)
            if cfg.fits(m, n_out, k) and cfg.shared_bytes() <= _SMEM and k // bk // splits >= stages:
                out.append(cfg)
    return out


def _weights(n, k, layers, dtype, device):
    import torch
    return [torch.randn(n, k, dtype=dtype, device=device) / k ** 0.5 for _ in range(layers)]


def _time(op, ws, x, replays):
    return best_replay_s(lambda i: op(x, ws[i]), len(ws), replays)


def _cells(shapes):
    """(name, N, K, silu) per swept cell kind: each projection, and gate_up again with its
    SiLU-and-mul fused (against the better of cuBLAS and the plain table row, each + the SiLU
    kernel)."""
    for name, (n, k) in shapes.items():
        yield name, n, k, False
        if name == "gate_up":
            yield "gate_up+silu", n, k, True


def _then_norm(op, res, nw):
    """`op` followed by the add + norm that reads its output (or its split-K partials)."""
    from infer_cluster.kernels.norm import add_rms_norm
    return lambda a, w: add_rms_norm(op(a, w), res, nw, 1e-6)


def sweep(args, dev, dtype):
    import torch
    import torch.nn.functional as F

    from infer_cluster.kernels.activation import silu_and_mul
    from infer_cluster.kernels.gemm import sum_partials
    from infer_cluster.kernels.gemm_gluon import BLOCK_M, gemm_sm90
    layers, shapes = SHAPES[args.model]
    if args.shapes:
        shapes = {name: shapes[name] for name in args.shapes}
    rows, table, plain_best = [], {}, {}
    for name, n, k, silu in _cells(shapes):
        ws = _weights(n, k, layers, dtype, dev)
        split = name in SPLIT_OK
        for m in args.m:
            x = torch.randn(m, k, dtype=dtype, device=dev)
            ref = F.linear(x, ws[0])
            res = torch.randn(m, n, dtype=dtype, device=dev)
            nw = torch.ones(n, dtype=dtype, device=dev)
            if split:
                t_base = _time(_then_norm(lambda a, w: F.linear(a, w), res, nw), ws, x, args.replays)
            elif silu:
                ref = silu_and_mul(ref)
                t_base = _time(lambda a, w: silu_and_mul(F.linear(a, w)), ws, x, args.replays)
                if plain_best.get(m) is not None:
                    t_base = min(t_base, _time(lambda a, w, c=plain_best[m]: silu_and_mul(gemm_sm90(a, w, c)),
                                               ws, x, args.replays))
            else:
                t_base = _time(lambda a, w: F.linear(a, w), ws, x, args.replays)
            best = (t_base, None)
            for cfg in candidates(m, n, k, silu, split):
                out = gemm_sm90(x, ws[0], cfg, silu=silu, partials=split)
                if cfg.splits > 1:
                    out = sum_partials(out, m)
                err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                if not err < 2e-2:
                    print(f"  MISMATCH {name} m={m} {cfg}: rel err {err:.3g}", flush=True)
                    continue
                op = lambda a, w, c=cfg: gemm_sm90(a, w, c, silu=silu, partials=split)  # noqa: E731
                t = _time(_then_norm(op, res, nw) if split else op, ws, x, args.replays)
                rows.append(dict(shape=name, n=n, k=k, m=m, cfg=dataclasses.asdict(cfg), us=t * 1e6,
                                 baseline_us=t_base * 1e6))
                if t < best[0]:
                    best = (t, cfg)
            t, cfg = best
            if name == "gate_up":
                plain_best[m] = cfg
            base = "cuBLAS + SiLU" if silu else ("cuBLAS + add-norm" if split else "cuBLAS")
            print(f"{name:12s} N={n:5d} K={k:5d} M={m:3d}: {base} {t_base * 1e6:6.2f} us, best "
                  f"{t * 1e6:6.2f} us ({t_base / t:.2f}x) {cfg}", flush=True)
            key = (n, k, -(-m // BLOCK_M)) + (("silu",) if silu else ())
            keep = cfg if cfg is not None and t_base / t >= 1 + args.margin else None
            note = f"{name} M={m}: {t * 1e6:.2f} us vs {base} {t_base * 1e6:.2f} us"
            # one entry per key: the largest M swept for it (its slowest case) decides
            if key not in table or table[key][2] < m:
                table[key] = (keep, note, m)
    lines = []
    for key, (cfg, note, _) in sorted(table.items(), key=lambda kv: tuple(map(str, kv[0]))):
        text = "None" if cfg is None else (f"GemmConfig(block_n={cfg.block_n}, block_k={cfg.block_k}, "
                                           f"stages={cfg.stages}"
                                           + (f", splits={cfg.splits})" if cfg.splits > 1 else ")"))
        lines.append(f"    {key}: {text},  # {note}")
    print("\n# kernels/gemm_table.py entries (N, K, 64-row tiles): GemmConfig or None (cuBLAS)")
    print("\n".join(lines))
    if args.write:
        _write_table(lines, args)
    return rows


def _write_table(lines, args):
    """Rewrite kernels/gemm_table.py: this sweep's entries, plus the file's entries for shapes this
    sweep did not cover (other models), each with its own stamp line kept above it."""
    info = run_info()
    path = os.path.join(_ROOT, "kernels", "gemm_table.py")
    text = open(path).read()
    head, body = text.split("TABLE: dict = {", 1)
    swept = {line.split(":")[0].strip() for line in lines}
    kept = [line for line in body.rsplit("}", 1)[0].strip("\n").split("\n")
            if line.strip() and (line.lstrip().startswith("#") or line.split(":")[0].strip() not in swept)]
    stamp = (f"    # {args.model}: `python bench/gemm.py --sweep --write --model {args.model} --m "
             f"{' '.join(map(str, args.m))}`, {info.get('device_name')}, {info.get('date')}, "
             f"commit {info.get('commit')}")
    # drop stamp lines whose entries all moved to this sweep (a stamp stays above the entries of
    # its sweep that this one did not redo)
    out, pending = [], None
    for line in kept:
        if line.lstrip().startswith("#"):
            pending = line
            continue
        if pending is not None:
            out.append(pending)
            pending = None
        out.append(line)
    with open(path, "w") as f:
        f.write(head + "TABLE: dict = {\n" + "\n".join(out + [stamp] + lines) + "\n}\n")
    print(f"wrote {path}")


def chain(args, dev, dtype):
    """A graph of the model's layers, each its four projections in order with gate_up's
    SiLU-and-mul between (the down projection reads its output's shape): cuBLAS and the SiLU
    kernel, against the table (`linear_mid`, `silu_linear_mid`)."""
    import torch
    import torch.nn.functional as F

    from infer_cluster.kernels.activation import silu_and_mul
    from infer_cluster.kernels.gemm import gemm_config, linear_mid, silu_linear_mid
    from infer_cluster.kernels.norm import add_rms_norm
    layers, shapes = SHAPES[args.model]
    ws = {name: _weights(n, k, layers, dtype, dev) for name, (n, k) in shapes.items()}
    hidden = shapes["o"][0]
    nw = torch.ones(hidden, dtype=dtype, device=dev)
    rows = []
    for m in args.m:
        xs = {name: torch.randn(m, k, dtype=dtype, device=dev) for name, (n, k) in shapes.items()}
        res = torch.randn(m, hidden, dtype=dtype, device=dev)
        picks = {name: gemm_config(m, n, k) for name, (n, k) in shapes.items()}
        picks["gate_up+silu"] = gemm_config(m, *shapes["gate_up"], silu=True)

        def layer_chain(linear, gate_up_silu, partials=False):
            def step(i):  # o and down each with the add + norm after it (which sums partials)
                linear(xs["qkv"], ws["qkv"][i])
                add_rms_norm(linear(xs["o"], ws["o"][i], **({"partials": True} if partials else {})), res, nw, 1e-6)
                gate_up_silu(xs["gate_up"], ws["gate_up"][i])
                add_rms_norm(linear(xs["down"], ws["down"][i], **({"partials": True} if partials else {})),
                             res, nw, 1e-6)
            return step
        t_cublas = best_replay_s(layer_chain(lambda x, w: F.linear(x, w),
                                             lambda x, w: silu_and_mul(F.linear(x, w))), layers, args.replays)
        t_mid = best_replay_s(layer_chain(linear_mid, silu_linear_mid, partials=True), layers, args.replays)
        print(f"M={m:3d}: a layer's four GEMMs, SiLU and two add-norms: cuBLAS {t_cublas * 1e6:6.2f} us, table "
              f"{t_mid * 1e6:6.2f} us ({t_cublas / t_mid:.3f}x); picks "
              + ", ".join(f"{k}={v}" for k, v in picks.items()), flush=True)
        rows.append(dict(m=m, cublas_us=t_cublas * 1e6, table_us=t_mid * 1e6,
                         picks={k: str(v) for k, v in picks.items()}))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-0.6b", choices=sorted(SHAPES))
    p.add_argument("--m", type=int, nargs="+", default=[32, 64, 128, 192, 256])
    p.add_argument("--sweep", action="store_true", help="time every config per shape and M; print the table")
    p.add_argument("--write", action="store_true", help="with --sweep: rewrite kernels/gemm_table.py")
    p.add_argument("--margin", type=float, default=0.03, help="the table keeps cuBLAS unless a config is this much faster")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--shapes", nargs="+", default=None,
                   help="with --sweep: only these projections (qkv o gate_up down; gate_up includes its SiLU row)")
    p.add_argument("--out", default=os.path.join(_ROOT, "bench", "results", "gemm.json"))
    args = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("bench/gemm.py needs a Hopper GPU (sm_90); nothing to time here")
        return 0
    dev, dtype = torch.device("cuda"), torch.bfloat16
    rows = sweep(args, dev, dtype) if args.sweep else chain(args, dev, dtype)
    write_json(args.out, {"run": run_info(), "model": args.model, "sweep": args.sweep, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
