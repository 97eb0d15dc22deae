"""The sampler's draw kernels (kernels/sample_triton.py) against their plain-torch references,
the torch paths of worker/sampling/ops.py and the host Philox stream: the same ids, the same
"unresolved" flags and top-k thresholds, the same ids after the redo, and the same uniforms.

`INFER_CLUSTER_KERNELS` picks the path (dispatch.use_triton), so one call of the public
`draw_random_rows` / `Sampler` runs each side on the same inputs.
"""

import numpy as np
import pytest
import torch

from infer_cluster.kernels.sample import MAX_CANDIDATES, float32_copy, random_columns
from infer_cluster.protocol.sampling_params import SamplingParams
from infer_cluster.worker.sampling.random_stream import step_uniforms
from infer_cluster.worker.sampling import ops as sampling_ops
from infer_cluster.worker.sampling.sampler import Sampler
from infer_cluster.worker.sampling.draw_io import SamplingRequestState
from infer_cluster.worker.sampling.ops import (TOP_K_TIE_MARGIN, RandomRows, draw_random_rows,
                                               sample_random_rows)

VOCAB = 1000  # wider than TOP_P_CANDIDATES: top-p rows take the candidate path and its mass pass

# (temperature, top_k, top_p, min_p): every path of the draw.
PARAMS = [
    (0.8, 50, 0.9, 0.0),    # the bench's sampled kind: top-k + top-p
    (1.0, 20, 1.0, 0.0),    # top-k alone
    (0.7, 0, 0.9, 0.0),     # top-p alone: candidates, the whole row's mass
    (1.2, 5, 0.5, 0.1),     # every filter
    (1.0, 0, 1.0, 0.05),    # min-p alone: the full path
    (0.7, 0, 1.0, 0.0),     # temperature alone: the full path (the penalties kind)
    (0.5, 300, 0.99, 0.0),  # 364 candidates: the widest tile
    (1.0, 2, 1.0, 0.0),
]


def random_rows(params, uniforms, device) -> RandomRows:
    col = lambda j, dt: torch.tensor([p[j] for p in params], dtype=dt, device=device)  # noqa: E731
    return RandomRows(temperature=col(0, torch.float32), top_k=col(1, torch.long), top_p=col(2, torch.float32),
                      min_p=col(3, torch.float32),
                      uniform=torch.tensor(uniforms, dtype=torch.float64, device=device),
                      host_top_k=[p[1] for p in params], host_top_p=[p[2] for p in params],
                      host_min_p=[p[3] for p in params])


def both_paths(monkeypatch, fn):
    got = {}
    for mode in ("torch", "triton"):
        monkeypatch.setenv("INFER_CLUSTER_KERNELS", mode)
        got[mode] = fn()
    return got["torch"], got["triton"]


def assert_same_draw(ref, got, params):
    """The draw before any redo. The kernels finish a flagged top-p row without top-k on the
    device (its final id, no flag), where the torch path leaves a provisional id and a flag;
    every other row has the torch path's id and flag, and every row its top-k threshold."""
    (ref_ids, ref_flags, ref_kth), (ids, flags, kth) = ref, got
    assert kth == ref_kth
    cand = [i for i, (_, k, p, _) in enumerate(params) if k or p < 1.0]  # the flags' rows, in order
    for j, i in enumerate(cand):
        _, k, p, _ = params[i]
        if k == 0 and p < 1.0 and ref_flags[j]:
            assert not flags[j], i
        else:
            assert (ids[i], flags[j]) == (ref_ids[i], ref_flags[j]), i
    full = [i for i in range(len(params)) if i not in cand]
    assert [ids[i] for i in full] == [ref_ids[i] for i in full]


def draw(x, rows):
    ids, unresolved = draw_random_rows(x, rows)
    if unresolved is None:
        return ids.tolist(), None, None
    return ids.tolist(), unresolved.flags.tolist(), unresolved.kth.flatten().tolist()


@pytest.mark.parametrize("case", ["smooth", "peaky", "ties"])
def test_draw_equals_torch_paths(device, monkeypatch, case):
    g = torch.Generator().manual_seed({"smooth": 1, "peaky": 2, "ties": 3}[case])
    params = PARAMS * 2
    x = torch.randn(len(params), VOCAB, generator=g)
    if case == "peaky":
        x = x * 6
    if case == "ties":  # bf16-like logits: many equal values around every threshold
        x = (x * 2).round() / 2
    x = x.to(device)
    u = torch.rand(len(params), generator=g, dtype=torch.float64).tolist()
    ref, got = both_paths(monkeypatch, lambda: draw(x, random_rows(params, u, device)))
    assert_same_draw(ref, got, params)
    # and after the redo of the flagged rows (the full path with the row's thresholds)
    ref, got = both_paths(monkeypatch, lambda: sample_random_rows(x, random_rows(params, u, device)).tolist())
    assert got == ref


def _tied_rows(device):
    """Top-k rows whose k-th value ties with more values than k + margin candidates hold (and a
    top-p row): logits, (temperature, top_k, top_p, min_p) per row, uniforms."""
    x = torch.zeros(4, VOCAB)
    x[:, :3] = 2.0
    x[:, 3:3 + 2 * TOP_K_TIE_MARGIN] = 1.0
    params = [(1.0, 10, 1.0, 0.0), (1.0, 10, 0.95, 0.0), (0.9, 4, 1.0, 0.0), (1.0, 0, 0.99, 0.0)]
    return x.to(device), params, [0.99, 0.7, 0.5, 0.999]


def test_ties_past_the_margin_are_flagged_and_redone(device, monkeypatch):
    x, params, u = _tied_rows(device)
    ref, got = both_paths(monkeypatch, lambda: draw(x, random_rows(params, u, device)))
    assert_same_draw(ref, got, params)
    assert got[1][0] and got[1][1] and got[1][2]  # every top-k row is flagged for the redo
    ref, got = both_paths(monkeypatch, lambda: sample_random_rows(x, random_rows(params, u, device)).tolist())
    assert got == ref
    assert got[0] >= 3 and got[2] >= 3  # the tie group past k was reachable


def test_copy_flagged_rows_keeps_only_the_flagged_rows(device):
    """What a redo reads after the step's logits buffer is rewritten: the flagged rows, by their
    own index or through a row map (a subset of the step's rows took the candidate path)."""
    from infer_cluster.kernels.sample_triton import copy_flagged_rows
    x = torch.randn(6, 5000, device=device).to(torch.bfloat16)
    flags = torch.tensor([False, True, False, False, True, False], device=device)
    kept = copy_flagged_rows(x, flags)
    assert kept.shape == x.shape and kept.dtype == x.dtype
    assert torch.equal(kept[1], x[1]) and torch.equal(kept[4], x[4])
    rows = torch.tensor([5, 0, 3], device=device)
    kept = copy_flagged_rows(x, flags[:3].long(), rows)  # only rows[1] = 0 is flagged (int64 flags)
    assert torch.equal(kept[0], x[0])
    empty = copy_flagged_rows(x, torch.zeros(0, dtype=torch.bool, device=device))
    assert empty.shape == x.shape


def test_redo_after_the_logits_buffer_is_rewritten(device, monkeypatch):
    """A draw over the caller's own buffer (`private=False`, as the sampler's all-random steps):
    the buffer is overwritten before the redo, as the next step's forward does under async
    scheduling, and the redo still gives the synchronous draw's ids."""
    x, params, u = _tied_rows(device)

    def run():
        want = sample_random_rows(x.clone(), random_rows(params, u, device)).tolist()
        buf = x.clone()
        out, unresolved = draw_random_rows(buf, random_rows(params, u, device), private=False)
        host = unresolved.flags.tolist()
        buf.normal_()  # the next step's logits in the same buffer
        unresolved.apply(out, host)
        return want, out.tolist(), host
    for want, got, host in both_paths(monkeypatch, run):
        assert got == want and any(host)


def test_top_p_threshold_kernel_equals_the_torch_bisection(device):
    """The full path's top-p cut (a bisection over the float32 bit order): the kernel finds the
    torch loop's threshold, with and without a top-k threshold below it."""
    g = torch.Generator().manual_seed(7)
    x = torch.cat([torch.randn(3, VOCAB, generator=g) * 0.2,                 # flat: a wide top-p set
                   (torch.randn(3, VOCAB, generator=g) * 2).round() / 2]).to(device)  # ties
    m = x.amax(dim=-1, keepdim=True)
    inv_t = torch.tensor([[1.0], [1.25], [0.5], [1.0], [2.0], [1.1]], device=device)
    tau = torch.full_like(m, float("-inf"))
    tau[1] = x[1].sort(descending=True).values[600]
    tau[4] = x[4].sort(descending=True).values[40]
    top_p = torch.tensor([[0.9], [0.5], [0.99], [0.95], [0.3], [0.7]], device=device)
    want = sampling_ops.top_p_threshold(x, m, inv_t, tau, top_p)
    got = sampling_ops.top_p_threshold_kernel(x, m, inv_t, tau, top_p)
    assert torch.equal(got, want)


def test_top_p_threshold_kernel_over_hard_rows(device):
    """The multi-way search finds the bisection's key on rows that stress its bracket: one kept
    value, all-negative and all-positive rows, a huge range (-1e30 next to small values), exact
    ties at the cut, temperatures that underflow most of the row, and a top-k threshold that
    leaves a handful of values."""
    g = torch.Generator().manual_seed(11)
    rows = [torch.full((VOCAB,), -3.0).index_fill_(0, torch.tensor([17]), 2.0),   # one value far above
            -(torch.rand(VOCAB, generator=g) * 5 + 1),                            # every logit < 0
            torch.rand(VOCAB, generator=g) * 5 + 1,                               # every logit > 0
            torch.where(torch.rand(VOCAB, generator=g) < 0.5, -1e30, 0.0) + torch.randn(VOCAB, generator=g),
            torch.randint(0, 4, (VOCAB,), generator=g).float(),                   # four tie groups
            torch.randn(VOCAB, generator=g) * 30,                                  # most weights underflow
            torch.zeros(VOCAB),                                                    # one tie group
            torch.randn(VOCAB, generator=g)]
    x = torch.stack(rows).to(device)
    n = x.shape[0]
    m = x.amax(dim=-1, keepdim=True)
    inv_t = torch.tensor([[1.0], [0.9], [1.3], [1.0], [1.0], [2.0], [1.0], [0.25]], device=device)
    tau = torch.full_like(m, float("-inf"))
    tau[7] = x[7].sort(descending=True).values[5]
    for p in (0.05, 0.5, 0.9, 0.999):
        top_p = torch.full((n, 1), p, device=device)
        want = sampling_ops.top_p_threshold(x, m, inv_t, tau, top_p)
        got = sampling_ops.top_p_threshold_kernel(x, m, inv_t, tau, top_p)
        assert torch.equal(got, want), (p, got.flatten().tolist(), want.flatten().tolist())
    # bfloat16 logits (the model's own, no float32 copy): the search over bfloat16 keys finds the
    # float32 bisection's answer on the same values
    xb = x.to(torch.bfloat16)
    xf = xb.float()
    mb = xf.amax(dim=-1, keepdim=True)
    taub = torch.where(tau > float("-inf"), xf[7].sort(descending=True).values[5], tau)
    for p in (0.05, 0.5, 0.9, 0.999):
        top_p = torch.full((n, 1), p, device=device)
        want = sampling_ops.top_p_threshold(xf, mb, inv_t, taub, top_p)
        got = sampling_ops.top_p_threshold_kernel(xb, mb, inv_t, taub, top_p)
        assert torch.equal(got, want), (p, got.flatten().tolist(), want.flatten().tolist())


def test_flat_top_p_rows_are_redone_alike(device, monkeypatch):
    """Top-p rows whose kept set is wider than their candidates (flat logits): the torch path
    flags them for the redo; the kernels finish them in the draw (threshold kernel, full draw,
    no host sync): the torch path's ids after its redo."""
    g = torch.Generator().manual_seed(8)
    x = (torch.randn(6, VOCAB, generator=g) * 0.3).to(device)
    params = [(1.0, 0, 0.9, 0.0), (0.8, 0, 0.95, 0.0), (1.2, 0, 0.5, 0.02), (1.0, 0, 0.9, 0.0),
              (0.7, 300, 0.9, 0.0), (1.0, 0, 0.8, 0.0)]
    u = torch.rand(6, generator=g, dtype=torch.float64).tolist()
    ref, got = both_paths(monkeypatch, lambda: draw(x, random_rows(params, u, device)))
    assert_same_draw(ref, got, params)
    assert all(ref[1][:4]) and not any(got[1][:4])  # flagged by the torch path, finished on the device
    assert ref[1][4] == got[1][4]  # the top-k row: the same flag either way
    # the device-finished ids are the torch path's after its redo
    ref, got = both_paths(monkeypatch, lambda: sample_random_rows(x, random_rows(params, u, device)).tolist())
    assert got == ref


def test_top_p_alone_rows_within_their_candidates_use_the_whole_row_mass(device, monkeypatch):
    """Top-p rows without top-k whose kept set fits their candidates are drawn in the candidate
    kernel, against their whole row's mass (summed by the block-sums launch before it): a
    plateau of 300 high logits, cut near its middle, drawn at uniforms across (0, 1)."""
    g = torch.Generator().manual_seed(12)
    rows = 12
    x = torch.full((rows, VOCAB), -4.0)
    for r in range(rows):
        x[r, torch.randperm(VOCAB, generator=g)[:300]] = 3.0 + 0.05 * torch.rand(300, generator=g)
    x = x.to(device)
    params = [(1.0, 0, 0.5, 0.0)] * (rows // 2) + [(0.9, 0, 0.3, 0.0)] * (rows - rows // 2)
    u = [(j + 0.5) / rows for j in range(rows)]
    ref, got = both_paths(monkeypatch, lambda: draw(x, random_rows(params, u, device)))
    assert_same_draw(ref, got, params)
    assert not any(ref[1]) and not any(got[1])  # every set fits its candidates: nothing to redo


def test_a_row_draws_the_same_alone_and_in_a_batch(device, monkeypatch):
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    g = torch.Generator().manual_seed(4)
    x = torch.randn(len(PARAMS), VOCAB, generator=g).to(device)
    u = torch.rand(len(PARAMS), generator=g, dtype=torch.float64).tolist()
    batch = sample_random_rows(x, random_rows(PARAMS, u, device)).tolist()
    alone = [sample_random_rows(x[i:i + 1], random_rows(PARAMS[i:i + 1], u[i:i + 1], device)).item()
             for i in range(len(PARAMS))]
    assert batch == alone


def test_wider_candidate_sets_take_the_torch_path(device, monkeypatch):
    k = MAX_CANDIDATES  # k + margin candidates: more than the kernel takes
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 2 * VOCAB, generator=g).to(device)
    params = [(1.0, k, 0.9, 0.0), (0.8, 50, 0.9, 0.0)]
    ref, got = both_paths(monkeypatch, lambda: sample_random_rows(x, random_rows(params, [0.3, 0.6], device)).tolist())
    assert got == ref


@pytest.mark.parametrize("transposed", [False, True])
def test_random_columns_equal_torch_casts_and_host_stream(device, transposed):
    """One launch gives what the sampler's torch casts gave (float32 temperature / top_p / min_p,
    int64 top_k, 1 / temperature by IEEE division) and the host stream's uniforms, from the
    float64 upload as the sampler packs it ([6, n], or its draw graphs' transposed [n, 6])."""
    rng = np.random.default_rng(3)
    n = 301  # three programs, the last one partial; columns of an odd length
    seeds = rng.integers(0, 2 ** 63 - 1, n, dtype=np.int64)
    steps = rng.integers(0, 2 ** 40, n, dtype=np.int64)
    # the counter's edges (its low and high 32-bit words) and the key's
    edges = [0, 1, 2, 7, 1000, 2 ** 31 - 1, 2 ** 32, 2 ** 33 + 5, 2 ** 40]
    steps[:len(edges)] = edges
    seeds[:4] = [0, 12345, 2 ** 40 + 7, 2 ** 63 - 1]
    packed = np.empty((6, n), dtype=np.float64)
    packed[0] = rng.choice([0.1, 0.7, 0.8, 1.0, 1.3, 1e-5, 3.7], n) * rng.uniform(0.9, 1.1, n)
    packed[1] = rng.integers(0, 151936, n)
    packed[2] = rng.uniform(0.0, 1.0, n)
    packed[3] = rng.uniform(0.0, 0.3, n)
    packed[4] = seeds.view(np.float64)
    packed[5] = steps.view(np.float64)
    dev = torch.from_numpy(packed.T.copy()).to(device).T if transposed else torch.from_numpy(packed).to(device)
    f32, top_k, uniform = random_columns(dev)
    ref = torch.from_numpy(packed)
    assert torch.equal(f32[0].cpu(), ref[0].float())
    assert torch.equal(f32[1].cpu(), ref[2].float())
    assert torch.equal(f32[2].cpu(), ref[3].float())
    assert torch.equal(f32[3].cpu(), 1.0 / ref[0].float())
    assert torch.equal(top_k.cpu(), ref[1].long())
    assert np.array_equal(uniform.cpu().numpy(), step_uniforms(seeds.tolist(), steps.tolist())[:, 0])
    # each column starts 16 bytes aligned (the draw's kernels specialize on it: no new variant)
    assert all(f32[r].data_ptr() % 16 == 0 for r in range(4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_penalties", [True, False])
def test_sampler_draws_the_same_ids_on_both_paths(device, monkeypatch, dtype, with_penalties):
    """The whole sampler (device uniforms, both draws, penalties, greedy and logprob rows mixed
    in) gives the torch path's ids over several steps. Without a penalty row and with bf16
    logits, the kernels read the model's logits as they are (no float32 copy); the torch path
    converts them first: the same values."""
    kinds = [SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=11),
             SamplingParams(temperature=0.7, repetition_penalty=1.1, presence_penalty=0.3, seed=12),
             SamplingParams(temperature=0.8, top_p=0.95, seed=13),
             SamplingParams(temperature=1.0, min_p=0.05, seed=14),
             SamplingParams(temperature=0.0),
             SamplingParams(temperature=0.9, top_k=20, logprobs=2, seed=15),
             SamplingParams(temperature=0.6)]  # unseeded: a key from the default generator
    if not with_penalties:
        kinds = [p for p in kinds if not p.has_penalties]
    g = torch.Generator().manual_seed(6)
    steps = [torch.randn(len(kinds), VOCAB, generator=g).to(device, dtype) for _ in range(3)]

    def run():
        sampler = Sampler(torch.Generator().manual_seed(3))
        outputs = [[] for _ in kinds]
        for logits in steps:
            rows = [SamplingRequestState(p, [5, 6, 7], list(out), None, (2,), f"r{i}")
                    for i, (p, out) in enumerate(zip(kinds, outputs))]
            for out, t in zip(outputs, sampler(logits, rows).token_ids):
                out.append(t)
        return outputs

    ref, got = both_paths(monkeypatch, run)
    assert got == ref


from tests.kernels.conftest import sm90_check  # noqa: E402

SM90_SPILLS = sm90_check("sampler_spills", """
from bench.ptxas_check import sampler_variants
from bench.sm90_build import compile_sm90, ptxas_info
for name, kernel, ptrs, ints, consts, opts, dns in sampler_variants():
    regs, spills = ptxas_info(compile_sm90(kernel, ptrs, ints, consts, opts, dns).asm["ptx"])
    print(name.replace(" ", "_"), regs, spills)
""")


def test_sm90_builds_do_not_spill(sm90_builds):
    """Compiled ahead of time for an H100 (no GPU needed; in a child process, as the interpreter
    cannot compile), at the launch options the entry points use: every sampler kernel fits its
    registers. The candidate kernel's 16 warps x [512, 16] tiles are sized for that (32-wide
    tiles spilled)."""
    rows = [line.split() for line in sm90_builds.get(SM90_SPILLS).splitlines()]
    assert len(rows) == 22
    assert [name for name, _, spills in rows if int(spills)] == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_float32_copy_is_the_cast(device, dtype, monkeypatch):
    """The penalty path's float32 copy of the logits: the cast kernel, bit for bit `x.float()`,
    infinities and NaN included, from a row view whose stride is wider than the vocabulary, and
    a new tensor."""
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")  # the kernel on the CPU too (interpreted)
    base = (4 * torch.randn(3, 5000 + 64, device=device)).to(dtype)
    x = base[:, :5000]
    x[0, :7] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0, 0.0, 65504, -65504],
                            dtype=dtype, device=device)
    got = float32_copy(x)
    assert got.dtype == torch.float32 and got.is_contiguous() and got.data_ptr() != x.data_ptr()
    want = x.float()
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_float32_copy_of_float32_logits_is_a_copy(device):
    x = torch.randn(2, 300, device=device)
    got = float32_copy(x)
    assert torch.equal(got, x) and got.data_ptr() != x.data_ptr()
