"""Random gated-delta-rule inputs shaped like a real GDN layer (L2-normalised keys, decays in (0, 1))."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
