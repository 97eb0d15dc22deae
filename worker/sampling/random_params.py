"""The random rows' parameters of one step: `random_plan` packs them on the host, and
`random_params` moves them to the device in one copy, with each row's uniform.

Owns: the per-step column (each row's step: tokens generated, pending ones included), the keys
of rows without a seed (drawn from the row's own generator, else one draw from the sampler's
default generator for all of them), and the uniforms. Where the draw runs its kernels the
uniforms are Philox on the device, in the one launch that also casts the columns
(`kernels.sample.random_columns`; the seeds' and steps' 64 bits ride in the float64 upload as
raw bits), else `random_stream.step_uniforms` on the host: the same values either way. The
fixed columns (temperature, top-k, top-p, min-p, candidates) come from the plan table
(worker/sampling/row_plans.py).

Must never: draw keys twice for one step (call `random_plan` once per step), or sync the device.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from infer_cluster.kernels.sample import random_columns, use_sample_kernels

from infer_cluster.worker.device.upload import dma_upload
from infer_cluster.worker.sampling.draw_graphs import DrawPlan
from infer_cluster.worker.sampling.ops import RandomRows, any_top_p_alone
from infer_cluster.worker.sampling.random_stream import step_uniforms
from infer_cluster.worker.sampling.row_plans import MIN_P, NEED, TEMPERATURE, TOP_K, TOP_P

_KEY_RANGE = 2 ** 63 - 1


def random_plan(rows: list, x: torch.Tensor, plan, default_generator: Optional[torch.Generator]) -> DrawPlan:
    """The random rows' parameters packed for one upload, and the host lists the draw plans
    with. `plan`: the rows' (table, seeds, seeded) from `RowPlans.gather`. Draws the keys of
    unseeded rows (`default_generator`: None is torch's global one)."""
    table, seeds, seeded = plan
    steps = [len(r.output_token_ids) + r.num_pending for r in rows]  # the one per-step column
    if not seeded.all():
        seeds = seeds.copy()
        drawn = []
        for j in np.flatnonzero(~seeded).tolist():
            r = rows[j]
            if r.generator is not None:
                seeds[j] = int(torch.randint(_KEY_RANGE, (1,), generator=r.generator,
                                             device=r.generator.device).item())
            else:
                drawn.append(j)
        if drawn:  # one draw for every unseeded row of the step
            gen = default_generator
            seeds[drawn] = torch.randint(_KEY_RANGE, (len(drawn),), generator=gen,
                                         device=gen.device if gen is not None else "cpu").tolist()
    on_device = use_sample_kernels(x)
    packed = np.empty((6 if on_device else 5, len(rows)), dtype=np.float64)
    packed[:4] = table[:, TEMPERATURE:MIN_P + 1].T
    if on_device:
        packed[4] = seeds.view(np.float64)
        packed[5] = np.asarray(steps, dtype=np.int64).view(np.float64)
    else:
        packed[4] = step_uniforms(seeds.tolist(), steps)[:, 0]
    top_k, need = table[:, TOP_K], table[:, NEED]
    return DrawPlan(packed, top_k.astype(np.int64).tolist(), table[:, TOP_P].tolist(),
                    table[:, MIN_P].tolist(), need.astype(np.int64).tolist(),
                    any_top_p_alone(top_k, need, x.shape[1]))


def random_params(rows: list, x: torch.Tensor, plan, default_generator: Optional[torch.Generator]) -> RandomRows:
    """Per-row parameters and uniforms on x's device, in one copy (`random_plan`'s arguments)."""
    p = random_plan(rows, x, plan, default_generator)
    packed = dma_upload(p.packed, x.device)
    host = dict(host_top_k=p.host_top_k, host_top_p=p.host_top_p, host_min_p=p.host_min_p, need=p.need,
                top_p_alone=p.top_p_alone)
    if p.packed.shape[0] == 6:  # on the device: one launch for the casts and the uniforms
        f32, top_k, uniform = random_columns(packed)
        return RandomRows(temperature=f32[0], top_k=top_k, top_p=f32[1], min_p=f32[2], uniform=uniform,
                          inv_t=f32[3].unsqueeze(1), **host)
    return RandomRows(temperature=packed[0].float(), top_k=packed[1].long(), top_p=packed[2].float(),
                      min_p=packed[3].float(), uniform=packed[4], **host)
