"""Random gated-delta-rule inputs shaped like a real GDN layer (L2-normalised keys, decays in (0, 1))."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from longsparse.ops.gdn.config import SparseGDNConfig, SparseGDNKernelConfig
from longsparse.ops.gdn.naive import compute_dtype, prepare_inputs
from longsparse.ops.gdn.spec import run_spec


def make_gdn_inputs(B, T, H, HV, K, V, dtype=torch.float64, device="cpu", with_state=False, n_states=None, seed=0):
    """``(q, k, v, g, beta, h0)``: k L2-normalised, g = logsigmoid(N(2, 1)), beta in (0, 1), h0 or None."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    q = r(B, T, H, K)
    k = F.normalize(r(B, T, H, K), dim=-1)
    v = r(B, T, HV, V)
    g = F.logsigmoid(r(B, T, HV) + 2.0)
    beta = torch.rand(B, T, HV, generator=gen, dtype=torch.float64)
    h0 = r(n_states or B, HV, K, V) * 0.1 if with_state else None
    to = lambda x: None if x is None else x.to(device=device, dtype=dtype)  # noqa: E731
    return tuple(to(x) for x in (q, k, v, g, beta, h0))


def make_gate(B, T, HV, V, dtype=torch.float64, seed=1):
    """``(gate [B, T, HV, V], gate_norm_weight [V])``: z ~ N(0, 1) with a per-head scale in [0.25, 4] (so visibility
    differs between heads) and a weight in [0.5, 1.5]."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    head_scale = 2.0 ** (4 * torch.rand(HV, 1, generator=gen, dtype=torch.float64) - 2)
    z = torch.randn(B, T, HV, V, generator=gen, dtype=torch.float64) * head_scale
    w = 0.5 + torch.rand(V, generator=gen, dtype=torch.float64)
    return z.to(dtype), w.to(dtype)


def spec_trace(q, k, v, g, beta, config=None, initial_state=None, cu_seqlens=None, gate=None, weight=None, mask=None):
    """Run the SparseGDN specification stage by stage (``spec.run_spec``) on FLA-layout inputs, keeping every stage."""
    dtype = compute_dtype(q.dtype)
    H, HV = q.shape[2], v.shape[2]
    qe, ke, v, g, beta = prepare_inputs(q, k, v, g, beta, dtype, False)
    return run_spec(
        qe,
        ke,
        v,
        g,
        beta,
        group=HV // H,
        scale=q.shape[-1] ** -0.5,
        config=config or SparseGDNConfig(),
        initial_state=None if initial_state is None else initial_state.to(dtype),
        cu_seqlens=cu_seqlens,
        gate=gate,
        gate_norm_weight=weight,
        mask=mask,
    )


def spread_decays(B, T, HV, dtype=torch.float64, seed=0):
    """``g [B, T, HV]`` = logsigmoid(N(c_h, 0.5)) with per-head centres c_h in [3, 10]: per-token retention from
    ~0.95 to ~0.9999, so heads have very different lifetimes as in a trained layer."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    centre = 3 + 7 * torch.rand(HV, generator=gen, dtype=torch.float64)
    return F.logsigmoid(centre + 0.5 * torch.randn(B, T, HV, generator=gen, dtype=torch.float64)).to(dtype)


BF16_MAIN_PASSES = ["walk", "walk-w", "walk-ks-stored", "csr"]
"""Main-pass variants of the bf16 GPU tests: ``main_pass``, then the walk's ``walk_correction`` and
``walk_scores`` where they are not the defaults."""


def main_pass_config(variant: str, **fields) -> SparseGDNKernelConfig:
    """The kernel config of a :data:`BF16_MAIN_PASSES` variant (plus ``fields``)."""
    main_pass, _, rest = variant.partition("-")
    correction, _, scores = rest.partition("-")
    correction = correction or SparseGDNKernelConfig.walk_correction
    return SparseGDNKernelConfig(
        main_pass=main_pass,
        walk_correction=correction,
        walk_scores=scores or SparseGDNKernelConfig.walk_scores,
        **fields,
    )
