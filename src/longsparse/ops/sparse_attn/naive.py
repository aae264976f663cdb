"""Pure-torch references of InfLLM-V2 / SparDA block-sparse attention: the specification the kernels must meet.

Notation (InfLLM-V2 (Zhao et al., arXiv:2509.24663) as restated by SparDA (Fu et al., arXiv:2606.04511) Sec. 3.1,
and SparDA's Forecast of its Sec. 4.1; positions are 0-based token indices, ``B`` below is ``config.block_size``):

* **Blocks.** Block ``b`` holds tokens ``[b·B, (b+1)·B)``; a query at position ``i`` lives in block ``qb = i // B``.
* **Compressed keys** (SparDA Sec. 3.1): ``K̃_j = mean(K[j·s : j·s + l])`` with window ``l = kernel_size`` and stride
  ``s = kernel_stride``, full windows only: ``N = (L − l) // s + 1`` keys for ``L ≥ l`` tokens, per batch row and KV
  head (MiniCPM4's ``CompressK``).
* **Causality of a compressed key.** Query ``i`` sees ``K̃_j`` iff its whole window lies at or before ``i``:
  ``j·s + l − 1 ≤ i``, i.e. ``j < n_vis(i) = (i + 1 − l) // s + 1`` (0 if ``i + 1 < l``). This is the causal mask of
  InfLLM-V2's stage-1 reference (``tests/test_stage1_causal.py``: ``(i + 1) // 16 − 1`` visible keys for 32/16) and
  what a decode step sees (keys of windows completed so far). SparDA's HF code masks by window start instead; the
  two differ only in windows pooled into the forced local window, so selections are identical when ``window ≥ B``.
* **InfLLM-V2 scores** ("Sparse" baseline): for KV head ``h`` with query heads ``hG … hG+G−1``,
  ``score(j) = Σ_g softmax_j(scale · q_{i,hG+g} · K̃_{h,j})`` over the visible ``j`` (softmax per head, summed over the
  GQA group). InfLLM-V2's CUDA stage 1 approximates each head's normaliser with coarser 128/64 keys and rounds the
  sum to bf16; we compute the exact normaliser and keep float32 (see ``select.py`` on what this costs). With
  ``config.group_reduce == "max"`` the group's heads are combined by their maximum instead of their sum.
* **Forecast scores** (SparDA Eq. 4): ``score(j) = f_{i,h} · K̃_{h,j}`` — one vector per GQA group, raw logits, no
  scale, no softmax. For one head softmax is monotone in the logit, so the top-k is the same (tested).
* **Pooling onto blocks.** ``blockscore(b) = max`` of ``score(j)`` over the visible compressed windows that overlap
  block ``b``: ``j ∈ [b·P − (R−1), b·P + P − 1]`` with ``P = B / s`` and ``R = l / s``. For 64 and 32/16 that is
  InfLLM-V2's ``max_pooling_1d`` (kernel ``P + 1 = 5``, stride ``P = 4``, padding 1). A block with no visible window
  scores ``−inf``. With ``n = config.neighbour_blocks`` the range starts ``n·P`` positions earlier (block ``b`` also
  takes the windows of blocks ``b − n … b − 1``): the blocks after a high-scoring block score as high as it.
* **Oracle** (a diagnostic bound): the block score is the dense attention mass of the block for the query group
  (:func:`block_mass_ref`); the same forced blocks and budget, no compression or pooling.
* **Forced blocks** ``F(i)``: ``b < init_blocks`` and ``qb − window/B ≤ b ≤ qb`` (InfLLM-V2's pooling kernel writes
  +inf there: ``off_bq >= off_bk && off_bq <= off_bk + local_blocks``), intersected with ``b ≤ qb``.
* **Dynamic blocks.** Candidates are the causal (``b ≤ qb``), non-forced blocks with a finite score. A query attends
  ``budget = topk + window/B`` blocks including ``F(i)``: it takes the ``budget − |F(i)|`` best candidates, ties
  going to the lower block index (deterministic; ``torch.topk`` does not promise this). With fewer candidates than
  that, it takes them all — the first tokens attend every causal block.
* **Block list.** ``F(i) ∪ chosen`` sorted ascending, padded with −1 to ``budget`` (decode: to
  ``config.decode_width()``), per query token and KV head: ``[B, T, Hkv, S]`` in prefill, ``[B, Hkv, S]`` in decode.
* **Dense mode.** Prefill of ``T < dense_len`` tokens is dense causal attention; a decode step whose sequence (new
  token included) is shorter than ``dense_len`` attends every causal block.
* **Attention.** Query ``i`` attends the keys ``p ≤ i`` (``p < seqlen`` in decode) of its listed blocks; −1 entries
  and blocks after ``qb`` contribute nothing; a query that attends no key outputs zeros.

Shapes are FlashAttention's: ``q [B, T, Hq, d]``, ``k, v [B, T, Hkv, d]``; ``cu_seqlens`` packs sequences along
``T`` with ``B == 1``. Everything here computes in float64 for float64 input and in float32 otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import SparseAttentionConfig


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _spans(T: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(0, T)]
    offsets = [int(x) for x in cu_seqlens.tolist()]
    return list(zip(offsets, offsets[1:]))


def compress_keys_ref(
    k: torch.Tensor, kernel_size: int, kernel_stride: int, cu_seqlens: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Compressed keys ``[B, N, Hkv, d]`` (``N = (T − l) // s + 1``, 0 if ``T < l``), means in ``k``'s dtype.

    With ``cu_seqlens`` (``B == 1``) each packed sequence is compressed on its own and the result is packed too;
    the second return value is then the compressed ``cu_seqlens``, else None.
    """
    out_dtype = k.dtype
    kk = k.to(_compute_dtype(k.dtype))
    pieces, offsets = [], [0]
    for s, e in _spans(k.shape[1], cu_seqlens):
        n = 0 if e - s < kernel_size else (e - s - kernel_size) // kernel_stride + 1
        starts = s + torch.arange(n, device=k.device) * kernel_stride
        idx = starts[:, None] + torch.arange(kernel_size, device=k.device)[None, :]
        pieces.append(kk[:, idx.reshape(-1)].reshape(k.shape[0], n, kernel_size, *k.shape[2:]).mean(dim=2))
        offsets.append(offsets[-1] + n)
    out = torch.cat(pieces, dim=1).to(out_dtype)
    if cu_seqlens is None:
        return out, None
    return out, torch.tensor(offsets, dtype=torch.int32, device=k.device)


def visible_compressed(positions: torch.Tensor, config: SparseAttentionConfig) -> torch.Tensor:
    """``n_vis(i)``: how many compressed keys the query at each position may see (same shape as ``positions``)."""
    n = torch.div(positions + 1 - config.kernel_size, config.kernel_stride, rounding_mode="floor") + 1
    return n.clamp_min(0)


def infllmv2_scores_ref(
    q: torch.Tensor, k_cmp: torch.Tensor, positions: torch.Tensor, config: SparseAttentionConfig, scale: float
) -> torch.Tensor:
    """InfLLM-V2 compressed-grid scores ``[B, Hkv, Tq, N]``: per-head softmax over visible keys, summed over the group.

    ``q [B, Tq, Hq, d]`` at ``positions [B, Tq]``; ``k_cmp [B, N, Hkv, d]``. Invisible entries are ``−inf``.
    """
    dt = _compute_dtype(q.dtype)
    B, Tq, Hq, d = q.shape
    Hkv, N = k_cmp.shape[2], k_cmp.shape[1]
    G = Hq // Hkv
    qg = q.to(dt).reshape(B, Tq, Hkv, G, d)
    logits = torch.einsum("bthgd,bnhd->bhgtn", qg, k_cmp.to(dt)) * scale
    visible = torch.arange(N, device=q.device)[None, None, :] < visible_compressed(positions, config)[:, :, None]
    logits = logits.masked_fill(~visible[:, None, None], float("-inf"))
    probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # a query with no visible key has no distribution
    grouped = probs.amax(dim=2) if config.group_reduce == "max" else probs.sum(dim=2)
    return grouped.masked_fill(~visible[:, None], float("-inf"))


def forecast_scores_ref(
    f: torch.Tensor, k_cmp: torch.Tensor, positions: torch.Tensor, config: SparseAttentionConfig
) -> torch.Tensor:
    """Forecast compressed-grid scores ``[B, Hkv, Tq, N]``: raw logits ``f · K̃`` (no scale, no softmax).

    ``f [B, Tq, Hkv, d]`` (one vector per GQA group) at ``positions [B, Tq]``; ``k_cmp [B, N, Hkv, d]`` — the *next*
    layer's compressed keys (layer 0 passes its own keys with its current-layer forecast). Invisible: ``−inf``.
    """
    dt = _compute_dtype(f.dtype)
    N = k_cmp.shape[1]
    logits = torch.einsum("bthd,bnhd->bhtn", f.to(dt), k_cmp.to(dt))
    visible = torch.arange(N, device=f.device)[None, None, :] < visible_compressed(positions, config)[:, :, None]
    return logits.masked_fill(~visible[:, None], float("-inf"))


def block_mass_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, block_size: int, scale: float):
    """Oracle block scores ``[B, Hkv, Tq, NB]``: the dense attention mass of each KV block for each query group.

    ``m(b) = (1/G) Σ_g Σ_{t ∈ b, t ≤ i} softmax_t(scale · q_{i,hG+g} · k_{h,t})`` — the group's heads averaged, so a
    query's masses sum to 1. ``q [B, Tq, Hq, d]`` at ``positions [B, Tq]``; ``k [B, T, Hkv, d]`` (keys past a query's
    position are not visible); ``NB = ceil(T / block_size)``. A block with no visible key has mass 0.
    """
    dt = _compute_dtype(q.dtype)
    B, Tq, Hq, d = q.shape
    T, Hkv = k.shape[1], k.shape[2]
    qg = q.to(dt).reshape(B, Tq, Hkv, Hq // Hkv, d)
    logits = torch.einsum("bthgd,bshd->bhgts", qg, k.to(dt)) * scale
    visible = torch.arange(T, device=q.device) <= positions[:, None, None, :, None]
    probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1).nan_to_num(0.0).mean(dim=2)
    NB = -(-T // block_size)
    probs = F.pad(probs, (0, NB * block_size - T))
    return probs.view(B, Hkv, Tq, NB, block_size).sum(-1)


def pool_blocks_ref(scores: torch.Tensor, num_blocks: int, config: SparseAttentionConfig) -> torch.Tensor:
    """Max over the compressed windows overlapping each block: ``[..., N] -> [..., num_blocks]`` (``−inf`` if none)."""
    N = scores.shape[-1]
    P, R = config.pool_stride, config.pool_reach
    # window b of the padded row covers positions [b·P − R, b·P + P) of the row (−inf outside it)
    right = num_blocks * P - N
    padded = F.pad(scores[..., : num_blocks * P], (R, max(right, 0)), value=float("-inf"))
    return padded.unfold(-1, P + R, P).amax(dim=-1)


def forced_blocks(positions: torch.Tensor, num_blocks: int, config: SparseAttentionConfig) -> torch.Tensor:
    """Boolean ``[*positions.shape, num_blocks]``: the init and local-window blocks of each query (causal)."""
    qb = torch.div(positions, config.block_size, rounding_mode="floor")[..., None]
    b = torch.arange(num_blocks, device=positions.device)
    forced = (b < config.init_blocks) | ((b >= qb - config.local_blocks) & (b <= qb))
    return forced & (b <= qb)


def select_blocks_ref(
    block_scores: torch.Tensor,
    positions: torch.Tensor,
    config: SparseAttentionConfig,
    *,
    dense_rows: torch.Tensor | None = None,
    width: int | None = None,
) -> torch.Tensor:
    """Block lists ``[B, Tq, Hkv, width]`` (int32, ascending, −1 padded) from block scores ``[B, Hkv, Tq, NB]``.

    ``dense_rows [B, Tq]`` (bool) marks queries that attend every causal block (decode below ``dense_len``).
    ``width`` defaults to ``config.budget_blocks``.
    """
    width = config.budget_blocks if width is None else width
    B, Hkv, Tq, NB = block_scores.shape
    qb = torch.div(positions, config.block_size, rounding_mode="floor")[:, None, :, None]
    blocks = torch.arange(NB, device=block_scores.device)
    causal = blocks <= qb
    forced = forced_blocks(positions, NB, config)[:, None]
    cand = causal & ~forced & torch.isfinite(block_scores)
    k_dyn = (config.budget_blocks - forced.sum(-1, keepdim=True)).clamp_min(0)
    masked = block_scores.masked_fill(~cand, float("-inf"))
    order = torch.sort(masked, dim=-1, descending=True, stable=True).indices  # equal scores keep index order
    rank = torch.empty_like(order).scatter_(-1, order, blocks.expand_as(order).contiguous())
    selected = forced | (cand & (rank < k_dyn))
    if dense_rows is not None:
        selected = torch.where(dense_rows[:, None, :, None], causal, selected)
    if int(selected.sum(-1).max()) > width:
        raise ValueError(f"a query selects {int(selected.sum(-1).max())} blocks, more than width={width}")
    keyed = torch.where(selected, blocks, NB + blocks)  # selected blocks first, in ascending order
    idx = torch.sort(keyed, dim=-1).values[..., :width]
    idx = torch.where(idx < NB, idx, torch.full_like(idx, -1))
    if idx.shape[-1] < width:
        idx = torch.cat([idx, idx.new_full((*idx.shape[:-1], width - idx.shape[-1]), -1)], dim=-1)
    return idx.permute(0, 2, 1, 3).to(torch.int32).contiguous()


def _prefill_positions(B: int, T: int, device) -> torch.Tensor:
    return torch.arange(T, device=device).expand(B, T)


def infllmv2_select_ref(
    q: torch.Tensor,
    k_cmp: torch.Tensor,
    config: SparseAttentionConfig,
    scale: float | None = None,
    return_scores: bool = False,
):
    """InfLLM-V2 prefill selection: ``q [B, T, Hq, d]``, ``k_cmp [B, N, Hkv, d]`` -> ``[B, T, Hkv, budget]``.

    With ``return_scores`` also returns the block scores ``[B, Hkv, T, NB]`` (float64 for float64 input).
    """
    B, T, _, d = q.shape
    scale = d**-0.5 if scale is None else scale
    pos = _prefill_positions(B, T, q.device)
    blocks = pool_blocks_ref(infllmv2_scores_ref(q, k_cmp, pos, config, scale), config.num_blocks(T), config)
    idx = select_blocks_ref(blocks, pos, config)
    return (idx, blocks) if return_scores else idx


def forecast_select_ref(f: torch.Tensor, k_cmp: torch.Tensor, config: SparseAttentionConfig, return_scores=False):
    """Forecast prefill selection: ``f [B, T, Hkv, d]``, next layer's ``k_cmp [B, N, Hkv, d]`` -> ``[B, T, Hkv, S]``."""
    B, T = f.shape[:2]
    pos = _prefill_positions(B, T, f.device)
    blocks = pool_blocks_ref(forecast_scores_ref(f, k_cmp, pos, config), config.num_blocks(T), config)
    idx = select_blocks_ref(blocks, pos, config)
    return (idx, blocks) if return_scores else idx


def _decode_rows(seqlens: torch.Tensor, config: SparseAttentionConfig):
    pos = (seqlens.long() - 1)[:, None]
    return pos, (seqlens.long() < config.dense_len)[:, None]


def infllmv2_select_decode_ref(
    q: torch.Tensor, k_cmp: torch.Tensor, seqlens: torch.Tensor, config: SparseAttentionConfig, scale=None
) -> torch.Tensor:
    """InfLLM-V2 decode selection: ``q [B, Hq, d]`` of the token at ``seqlens − 1`` -> ``[B, Hkv, decode_width]``.

    ``k_cmp [B, Ncap, Hkv, d]`` holds at least ``n_vis(seqlens − 1)`` valid keys per row (the rest is ignored).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    pos, dense = _decode_rows(seqlens, config)
    nb = config.num_blocks(int(seqlens.max()))
    scores = pool_blocks_ref(infllmv2_scores_ref(q[:, None], k_cmp, pos, config, scale), nb, config)
    return select_blocks_ref(scores, pos, config, dense_rows=dense, width=config.decode_width())[:, 0]


def forecast_select_decode_ref(
    f: torch.Tensor, k_cmp: torch.Tensor, seqlens: torch.Tensor, config: SparseAttentionConfig
) -> torch.Tensor:
    """Forecast decode selection: ``f [B, Hkv, d]`` against the next layer's ``k_cmp`` -> ``[B, Hkv, decode_width]``."""
    pos, dense = _decode_rows(seqlens, config)
    nb = config.num_blocks(int(seqlens.max()))
    scores = pool_blocks_ref(forecast_scores_ref(f[:, None], k_cmp, pos, config), nb, config)
    return select_blocks_ref(scores, pos, config, dense_rows=dense, width=config.decode_width())[:, 0]


def oracle_select_ref(q: torch.Tensor, k: torch.Tensor, config: SparseAttentionConfig, scale: float | None = None):
    """Oracle prefill selection (a diagnostic bound, not a product mode): the forced blocks, then the budget's other
    blocks by their dense attention mass (:func:`block_mass_ref`). ``q [B, T, Hq, d]``, ``k [B, T, Hkv, d]`` ->
    ``[B, T, Hkv, budget]``."""
    B, T, _, d = q.shape
    scale = d**-0.5 if scale is None else scale
    pos = _prefill_positions(B, T, q.device)
    return select_blocks_ref(block_mass_ref(q, k, pos, config.block_size, scale), pos, config)


def oracle_select_decode_ref(
    q: torch.Tensor, k: torch.Tensor, seqlens: torch.Tensor, config: SparseAttentionConfig, scale: float | None = None
) -> torch.Tensor:
    """Oracle decode selection: ``q [B, Hq, d]`` of the token at ``seqlens − 1`` over the cached keys ``k [B, L, Hkv,
    d]`` (positions ``>= seqlens`` ignored) -> ``[B, Hkv, decode_width]``."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    pos, dense = _decode_rows(seqlens, config)
    nb = config.num_blocks(int(seqlens.max()))
    scores = block_mass_ref(q[:, None], k[:, : nb * config.block_size], pos, config.block_size, scale)
    return select_blocks_ref(scores, pos, config, dense_rows=dense, width=config.decode_width())[:, 0]


def token_mask_from_blocks(block_idx: torch.Tensor, T: int, block_size: int) -> torch.Tensor:
    """``[B, T, Hkv, S]`` block lists -> causal token mask ``[B, Hkv, T, T]`` (True = query attends key)."""
    B, Tq, Hkv, S = block_idx.shape
    nb = -(-T // block_size)
    hit = torch.zeros(B, Tq, Hkv, nb + 1, dtype=torch.bool, device=block_idx.device)
    hit.scatter_(-1, torch.where((block_idx < 0) | (block_idx >= nb), nb, block_idx.long()), True)
    key_block = torch.arange(T, device=block_idx.device) // block_size
    mask = hit[..., :nb][..., key_block].permute(0, 2, 1, 3)  # [B, Hkv, Tq, T]
    causal = torch.arange(T, device=block_idx.device)[None, :] <= torch.arange(Tq, device=block_idx.device)[:, None]
    return mask & causal


def masked_attention_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """Attention under an explicit mask ``[B, Hkv, Tq, Tk]`` (shared by each GQA group); zero rows give zeros."""
    dt = _compute_dtype(q.dtype)
    B, Tq, Hq, d = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    scale = d**-0.5 if scale is None else scale
    qg = q.to(dt).reshape(B, Tq, Hkv, G, d)
    s = torch.einsum("bthgd,bshd->bhgts", qg, k.to(dt)) * scale
    s = s.masked_fill(~mask[:, :, None], float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    o = torch.einsum("bhgts,bshd->bthgd", p, v.to(dt))
    return o.reshape(B, Tq, Hq, d)


def sparse_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_idx: torch.Tensor,
    block_size: int,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense attention restricted to each query's listed blocks (the definition of block-sparse prefill).

    ``block_idx [B, T, Hkv, S]`` (−1 padded; block indices relative to each packed sequence with ``cu_seqlens``).
    Returns ``[B, T, Hq, d]`` in the compute dtype (float64 for float64 input).
    """
    outs = []
    for s, e in _spans(q.shape[1], cu_seqlens):
        mask = token_mask_from_blocks(block_idx[:, s:e], e - s, block_size)
        outs.append(masked_attention_ref(q[:, s:e], k[:, s:e], v[:, s:e], mask, scale))
    return torch.cat(outs, dim=1)


def dense_causal_attention_ref(q, k, v, scale=None, cu_seqlens=None) -> torch.Tensor:
    """Dense causal attention (GQA) in the compute dtype; the reference of the ``T < dense_len`` path."""
    outs = []
    for s, e in _spans(q.shape[1], cu_seqlens):
        L = e - s
        causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        mask = causal.expand(q.shape[0], k.shape[2], L, L)
        outs.append(masked_attention_ref(q[:, s:e], k[:, s:e], v[:, s:e], mask, scale))
    return torch.cat(outs, dim=1)


def sparse_decode_ref(
    q: torch.Tensor,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    block_table: torch.Tensor,
    block_ids: torch.Tensor,
    seqlens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """One decode step over a block-slot cache, the definition the decode kernel must meet.

    ``q [B, Hq, d]``; ``k_slots, v_slots [num_slots, block, d]`` (one KV head's block per slot);
    ``block_table [B, Hkv, S]`` slot ids and ``block_ids [B, Hkv, S]`` the logical block each slot holds (−1 =
    padding, in either); ``seqlens [B]`` tokens of each sequence including the new one. Key ``r`` of entry ``e`` is
    at position ``block_ids·block + r`` and is attended iff that is ``< seqlens[b]``. Returns ``[B, Hq, d]``.
    """
    dt = _compute_dtype(q.dtype)
    B, Hq, d = q.shape
    Hkv, S = block_table.shape[1:]
    G = Hq // Hkv
    blk = k_slots.shape[1]
    scale = d**-0.5 if scale is None else scale
    out = torch.zeros(B, Hq, d, dtype=dt, device=q.device)
    for b in range(B):
        for h in range(Hkv):
            valid = (block_table[b, h] >= 0) & (block_ids[b, h] >= 0)
            slots = block_table[b, h][valid].long()
            pos = (block_ids[b, h][valid].long()[:, None] * blk + torch.arange(blk, device=q.device)).reshape(-1)
            keep = pos < int(seqlens[b])
            if not bool(keep.any()):
                continue
            kk = k_slots[slots].reshape(-1, d)[keep].to(dt)
            vv = v_slots[slots].reshape(-1, d)[keep].to(dt)
            qq = q[b, h * G : (h + 1) * G].to(dt)
            p = torch.softmax(qq @ kk.T * scale, dim=-1)
            out[b, h * G : (h + 1) * G] = p @ vv
    return out


def compress_decode_step_ref(
    k_new: torch.Tensor,
    ring: torch.Tensor,
    k_cmp: torch.Tensor,
    cache_seqlens: torch.Tensor,
    kernel_size: int,
    kernel_stride: int,
) -> None:
    """Reference of one incremental compression step (in place; see ``compress.compress_decode_step``)."""
    for b in range(k_new.shape[0]):
        p = int(cache_seqlens[b])
        ring[b, p % kernel_size] = k_new[b]
        if p + 1 >= kernel_size and (p + 1 - kernel_size) % kernel_stride == 0:
            order = [(p + 1 - kernel_size + t) % kernel_size for t in range(kernel_size)]
            j = (p + 1 - kernel_size) // kernel_stride
            k_cmp[b, j] = ring[b, order].to(_compute_dtype(ring.dtype)).mean(dim=0).to(k_cmp.dtype)
