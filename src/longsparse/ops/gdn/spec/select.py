"""Event selection (SparseGDN (Zhuang et al., arXiv:2610.41420) Sec. 2.4, Eqs. 10–14, on the tail scores of
Eq. 9 in Sec. 2.3): which (head pair, chunk) events do the recurrent read and write.

A "pair" is the group of value heads that share one qk head (two in Qwen3.5; value head j belongs to pair
``j // group``); there are P = H pairs and one mask per (sequence, pair). Selection works per sequence on grids
``[N, P, Cmax]`` / ``[N, HV]`` (``layout.py``); nothing couples two sequences, so a sequence's mask does not depend
on its batch neighbours.

Pipeline (adaptive): tail scores s → per-pair chunk ranking q (Eq. 10); retention r_h → lifetime L_h; sampled gate
energy → visibility G_h (Eq. 11); nested tier sets from k_ℓ = clip(round(ρ_ℓ C), 2, C) (first and last chunk always,
then the best k_ℓ − 2 by q); upgrade gains Δ (Eq. 12), normalised per pair to x_M, x_H; split criterion B(x, k)
(Eq. 14) picks n_H, then n_M from the tier table (Eq. 13); each pair keeps its tier's set.

Conventions where the paper is silent (all documented in docs/sparsegdn.md):
* round(x) = floor(x + 0.5) in float64 (round half up).
* Ties in any top-k ranking go to the lower chunk index (chunk ranking) or lower pair index (pair ranking); ties in
  the argmax of B go to the smaller candidate count.
* x / mean(x) and s / ‖s‖ are 0 where the denominator is 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..config import SparseGDNConfig
from ..heads import HeadSplit
from ..layout import ChunkLayout
from ..selection import Selection, fixed_tier_counts, tier_sizes, tier_table

GATE_SAMPLE_POSITIONS = (8, 24, 40, 56)
GATE_COORD_STRIDE = 73
LOW, MID, HIGH = 0, 1, 2


def split_score(x_desc: torch.Tensor, n: torch.Tensor | int, k: torch.Tensor | int) -> torch.Tensor:
    """B(x, k) = k(n − k)/n · (mean(x_1..k) − mean(x_k+1..n))² (Eq. 14).

    Args:
        x_desc: ``[..., P]`` gains sorted descending; only the first ``n`` entries are the vector x.
        n, k: ``[...]`` (or ints) vector length and split point; B = 0 unless 0 < k < n.
    """
    P = x_desc.shape[-1]
    n = torch.as_tensor(n, device=x_desc.device)
    k = torch.as_tensor(k, device=x_desc.device)
    shape = torch.broadcast_shapes(x_desc.shape[:-1], n.shape, k.shape)
    n, k, x_desc = n.expand(shape), k.expand(shape), x_desc.expand(*shape, P)
    idx = torch.arange(P, device=x_desc.device)
    x = torch.where(idx < n[..., None], x_desc, torch.zeros_like(x_desc))
    cs = torch.cat([torch.zeros_like(x[..., :1]), x.cumsum(-1)], dim=-1)  # cs[..., i] = sum of the first i
    top = cs.gather(-1, k.clamp(0, P)[..., None])[..., 0]
    total = cs.gather(-1, n.clamp(0, P)[..., None])[..., 0]
    ok = (k > 0) & (k < n)
    kf, nf = k.to(x.dtype), n.to(x.dtype)
    safe_k, safe_rest, safe_n = kf.clamp(min=1), (nf - kf).clamp(min=1), nf.clamp(min=1)
    gap = top / safe_k - (total - top) / safe_rest
    return torch.where(ok, kf * (nf - kf) / safe_n * gap * gap, torch.zeros_like(gap))


def nominal_keep_ratio(n_high: int, n_mid: int, pairs: int, ratios) -> float:
    """Mean kept fraction of a tier split before rounding and anchors: (n_H ρ_H + n_M ρ_M + n_L ρ_L) / P."""
    lo, mid, high = ratios
    return (n_high * high + n_mid * mid + (pairs - n_high - n_mid) * lo) / pairs


def lifetime(layout: ChunkLayout, gamma: torch.Tensor, window: int) -> torch.Tensor:
    """L_h ``[N, HV]`` = Σ_{j=1}^{C−2} r_h^j, r_h = mean of e^γ over the last min(window, C) chunks (Eq. 11).

    gamma: ``[HV, NC]`` chunk total log decay (G_last; a partial chunk sums its valid tokens). L = 0 for C <= 2.
    """
    C = layout.chunks_per_seq
    in_window = (layout.chunk_pos >= (C[layout.chunk_seq] - window)).to(gamma.dtype)
    HV = gamma.shape[0]
    total = gamma.new_zeros(HV, layout.N).index_add_(1, layout.chunk_seq, gamma.exp() * in_window)
    count = C.clamp(max=window).to(gamma.dtype)
    r = (total / count.clamp(min=1)).T  # [N, HV]
    j = torch.arange(1, max(layout.Cmax - 1, 1), device=gamma.device)
    powers = r[..., None] ** j.to(gamma.dtype)
    return (powers * (j <= (C - 2)[:, None, None]).to(gamma.dtype)).sum(-1)


def visibility(
    layout: ChunkLayout,
    gate: torch.Tensor | None,
    gate_norm_weight: torch.Tensor | None,
    HV: int,
    dtype,
    heads: HeadSplit | None = None,
) -> torch.Tensor:
    """G_h ``[N, HV]`` = sqrt(η_h / mean_h η) from the sampled output-gate energy (Eq. 11).

    η_h = mean over the samples of (w[v] · silu(z[t, h, v]))², sampled in chunk c (sequence-local index) at positions
    8, 24, 40, 56 (a = 0..3) and coordinate v = 73 (4c + a) mod V; positions past the sequence's end are skipped.
    gate: ``[B, T, HV, V]`` pre-activation z; gate_norm_weight: ``[V]`` (None = ones). G_h = 1 for every head of a
    sequence without samples or whose mean η is 0, and everywhere when gate is None. With ``heads``, ``gate`` holds
    this call's heads and ``HV`` is the layer's: the others' η are gathered.
    """
    ones = torch.ones(layout.N, HV, dtype=dtype, device=layout.seq_lengths.device)
    if gate is None or layout.NC == 0:
        return ones
    V = gate.shape[-1]
    z = gate.reshape(-1, gate.shape[-2], V)
    a = torch.arange(len(GATE_SAMPLE_POSITIONS), device=z.device)
    token = layout.token_index[:, list(GATE_SAMPLE_POSITIONS)]  # [NC, 4]
    coord = (GATE_COORD_STRIDE * (4 * layout.chunk_pos[:, None] + a)) % V  # [NC, 4]
    held = torch.arange(z.shape[1], device=z.device)
    sample = z[token.clamp(min=0)[..., None], held, coord[..., None]].to(dtype)  # [NC, 4, heads held]
    weight = 1.0 if gate_norm_weight is None else gate_norm_weight.to(dtype)[coord][..., None]
    present = (token >= 0).to(dtype)
    energy = ((weight * F.silu(sample)) ** 2 * present[..., None]).sum(1)  # [NC, heads held]
    eta = energy.new_zeros(layout.N, z.shape[1]).index_add_(0, layout.chunk_seq, energy)
    count = present.sum(1).new_zeros(layout.N).index_add_(0, layout.chunk_seq, present.sum(1))
    eta = eta / count.clamp(min=1)[:, None]
    if heads is not None:
        eta = heads.gather(eta, 1)
    mean = eta.mean(-1, keepdim=True)
    ok = (mean > 0) & (count[:, None] > 0)
    return torch.where(ok, (eta / torch.where(ok, mean, 1.0)).sqrt(), ones)


def rank_scores(layout: ChunkLayout, score: torch.Tensor, group: int) -> torch.Tensor:
    """q ``[N, P, Cmax]`` = mean over the pair's heads of s_c,h / ‖s_·,h‖₂ (Eq. 10; the paper's ½ Σ for two heads),
    the norm over the sequence's chunks; 0 past C_n and for a head whose scores are all 0."""
    s = layout.to_grid(score, 0.0)  # [HV, N, Cmax]
    norm = s.pow(2).sum(-1, keepdim=True).sqrt()
    s = torch.where(norm > 0, s / torch.where(norm > 0, norm, 1.0), torch.zeros_like(s))
    HV = s.shape[0]
    return s.view(HV // group, group, layout.N, layout.Cmax).mean(1).permute(1, 0, 2)


def middle_ranks(key: torch.Tensor, chunks: torch.Tensor) -> torch.Tensor:
    """``[N, P, Cmax]`` rank of each middle chunk (1 ≤ c ≤ C − 2) by descending ``key``, ties to the lower chunk
    index; anchors and chunks past C get the rank Cmax (beyond every middle rank)."""
    pos = torch.arange(key.shape[-1], device=key.device)
    return ranks_among(key, (pos >= 1) & (pos <= (chunks - 2)[:, None]))


def ranks_among(key: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """``[N, P, Cmax]`` rank of each ``eligible [N, Cmax]`` chunk by descending ``key``, ties to the lower chunk
    index; the other chunks get the rank Cmax."""
    Cmax = key.shape[-1]
    pos = torch.arange(Cmax, device=key.device)
    masked = torch.where(eligible[:, None, :], key, torch.full_like(key, -math.inf))
    order = torch.sort(masked, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, pos.expand_as(order).contiguous())
    return torch.where(eligible[:, None, :], rank, torch.full_like(rank, Cmax))


def anchors(chunks: torch.Tensor, Cmax: int) -> torch.Tensor:
    """``[N, Cmax]`` bool: the first and last chunk of every non-empty sequence."""
    pos = torch.arange(Cmax, device=chunks.device)
    return ((pos == 0) | (pos == (chunks - 1)[:, None])) & (pos < chunks[:, None])


def tier_member(rank: torch.Tensor, anchor: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``[N, P, Cmax]`` bool membership in the set of size ``k [N, P]`` (or ``[N, 1]``): anchors plus the k − 2 best
    middle chunks. Sets of growing k are nested because they share one ranking."""
    return anchor[:, None, :] | (rank < (k - 2)[..., None])


def upgrade_gains(
    layout: ChunkLayout, score, lifetime_h, visibility_h, rank, tier_k, group
) -> tuple[torch.Tensor, torch.Tensor]:
    """Δ_L→M and Δ_M→H ``[N, P]`` (Eq. 12): Σ over the chunks the upgrade adds, Σ over the pair's heads of
    s_c,h L_h G_h, with the raw (not normalised) tail score s."""
    s = layout.to_grid(score, 0.0)  # [HV, N, Cmax]
    weighted = s * (lifetime_h * visibility_h).T[..., None]
    HV = s.shape[0]
    w = weighted.view(HV // group, group, layout.N, layout.Cmax).sum(1).permute(1, 0, 2)  # [N, P, Cmax]
    k_low, k_mid, k_high = ((tier_k[:, i] - 2)[:, None, None] for i in range(3))
    gain_mid = (w * ((rank >= k_low) & (rank < k_mid))).sum(-1)
    gain_high = (w * ((rank >= k_mid) & (rank < k_high))).sum(-1)
    return gain_mid, gain_high


def normalise_by_mean(x: torch.Tensor) -> torch.Tensor:
    """``x / mean(x)`` over the pairs (last dim); 0 where the mean is 0."""
    mean = x.mean(-1, keepdim=True)
    return torch.where(mean > 0, x / torch.where(mean > 0, mean, 1.0), torch.zeros_like(x))


def _descending_rank(x: torch.Tensor) -> torch.Tensor:
    """Rank of each entry of the last dim by descending value, ties to the lower index."""
    order = torch.sort(x, dim=-1, descending=True, stable=True).indices
    pos = torch.arange(x.shape[-1], device=x.device).expand_as(order).contiguous()
    return torch.empty_like(order).scatter_(-1, order, pos)


def choose_counts(
    x_high: torch.Tensor, x_mid: torch.Tensor, table: dict[int, tuple[int, ...]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(n_H, n_M) ``[N]`` from the table (Eqs. 13–14): n_H = argmax over the table's keys of B(x_H sorted, n_H),
    then, on the pairs left after taking the n_H best by x_H, n_M = argmax over that row of B(x_M sorted, n_M)."""
    N, P = x_high.shape
    dev = x_high.device
    highs = torch.tensor(list(table), device=dev)
    x_h = torch.sort(x_high, dim=-1, descending=True).values
    n_high = highs[split_score(x_h[:, None, :], P, highs[None, :]).argmax(-1)]
    width = max(len(m) for m in table.values())
    cand = torch.tensor([list(m) + [-1] * (width - len(m)) for m in table.values()], device=dev)
    row = cand[(n_high[:, None] == highs[None, :]).int().argmax(-1)]  # [N, width]
    high = _descending_rank(x_high) < n_high[:, None]
    rest = torch.where(high, torch.full_like(x_mid, -math.inf), x_mid)
    x_m = torch.sort(rest, dim=-1, descending=True).values
    b = split_score(x_m[:, None, :], (P - n_high)[:, None], row.clamp(min=0))
    b = torch.where(row >= 0, b, torch.full_like(b, -math.inf))
    n_mid = row.gather(-1, b.argmax(-1, keepdim=True))[:, 0]
    return n_high, n_mid


def assign_tiers(x_high, x_mid, n_high, n_mid) -> torch.Tensor:
    """tier ``[N, P]``: the n_H best pairs by x_H are high, the n_M best of the rest by x_M are mid, ties to the
    lower pair index."""
    high = _descending_rank(x_high) < n_high[:, None]
    rest = torch.where(high, torch.full_like(x_mid, -math.inf), x_mid)
    mid = ~high & (_descending_rank(rest) < n_mid[:, None])
    return torch.where(high, HIGH, torch.where(mid, MID, LOW))


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 values in [0, 2³²) (no int64 overflow: products stay below 2⁵⁹)."""
    for _ in range(2):
        x = ((x >> 16) ^ x) * 0x45D9F3B & 0xFFFFFFFF
    return (x >> 16) ^ x


def random_keys(seed: int, pairs: int, Cmax: int, N: int, device, dtype) -> torch.Tensor:
    """``[N, P, Cmax]`` uniform keys in [0, 1) that depend only on (seed, pair, chunk position): the same on every
    device, for every batch composition."""
    pair = torch.arange(pairs, device=device, dtype=torch.int64)[:, None]
    pos = torch.arange(Cmax, device=device, dtype=torch.int64)[None, :]
    h = _mix32(_mix32(_mix32(torch.tensor(seed, device=device)) ^ pair) ^ pos)
    return (h.to(torch.float64) / 2.0**32).to(dtype).expand(N, pairs, Cmax)


def select_events(
    layout: ChunkLayout,
    score: torch.Tensor,
    gamma: torch.Tensor,
    group: int,
    config: SparseGDNConfig,
    gate: torch.Tensor | None = None,
    gate_norm_weight: torch.Tensor | None = None,
    heads: HeadSplit | None = None,
) -> Selection:
    """Choose the events of every (sequence, pair).

    Args:
        layout: the packing. score: ``[HV, NC]`` tail scores s. gamma: ``[HV, NC]`` chunk total log decays.
        group: value heads per pair (HV / P). config: tier ratios, selection mode, visibility, windows, seed.
        gate, gate_norm_weight: ``[B, T, HV, V]`` and ``[V]`` for the visibility factor (optional).
        heads: the inputs hold these heads of the layer (:class:`~longsparse.ops.gdn.heads.HeadSplit`); the other
            heads' scores, decays and gate energies are gathered, and the selection is that of every pair of the
            layer, as one call over all heads chooses it.
    """
    if heads is not None:
        score, gamma = heads.gather(score, 0), heads.gather(gamma, 0)
    HV, dtype = score.shape[0], score.dtype
    P, N, Cmax = HV // group, layout.N, layout.Cmax
    C = layout.chunks_per_seq
    q = rank_scores(layout, score, group)
    life = lifetime(layout, gamma, config.lifetime_window)
    vis_gate = gate if config.visibility else None
    vis = visibility(layout, vis_gate, gate_norm_weight, HV, dtype, heads)
    tier_k = tier_sizes(C, config.tier_ratios)
    rank = middle_ranks(q, C)
    gain_mid, gain_high = upgrade_gains(layout, score, life, vis, rank, tier_k, group)
    x_mid, x_high = normalise_by_mean(gain_mid), normalise_by_mean(gain_high)
    valid = layout.grid_valid[:, None, :]

    if config.selection == "all":
        tier = torch.full((N, P), HIGH, dtype=torch.int64, device=q.device)
        n_high, n_mid = torch.full_like(C, P), torch.zeros_like(C)
        tier_k = C[:, None].expand(N, 3).clone()
        mask = valid.expand(N, P, Cmax).clone()
    elif config.selection == "uniform_random":  # a control: neither tiers nor anchors nor scores
        tier = torch.full((N, P), MID, dtype=torch.int64, device=q.device)
        n_high, n_mid = torch.zeros_like(C), torch.full_like(C, P)
        keys = random_keys(config.seed, P, Cmax, N, q.device, dtype)
        mask = (ranks_among(keys, layout.grid_valid) < tier_k[:, MID, None, None]) & valid
    else:
        if config.selection == "fixed_tiers":
            h, m = fixed_tier_counts(config.fixed_tiers, P, config.tier_ratios)
            n_high, n_mid = torch.full_like(C, h), torch.full_like(C, m)
        else:
            n_high, n_mid = choose_counts(x_high, x_mid, tier_table(P, config.tier_ratios))
        tier = assign_tiers(x_high, x_mid, n_high, n_mid)
        if config.selection == "random":
            rank = middle_ranks(random_keys(config.seed, P, Cmax, N, q.device, dtype), C)
        k_pair = tier_k.gather(1, tier)  # [N, P]
        mask = tier_member(rank, anchors(C, Cmax), k_pair) & valid
    return Selection(
        mask=mask,
        tier=tier,
        tier_k=tier_k,
        n_high=n_high,
        n_mid=n_mid,
        rank_score=q,
        lifetime=life,
        visibility=vis,
        gain_mid=x_mid,
        gain_high=x_high,
    )
