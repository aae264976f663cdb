"""Pure-torch references of the gated delta rule (FLA semantics), in any float dtype, on any device.

Two forms of one function:

* :func:`naive_recurrent_gated_delta_rule` steps token by token — the definition.
* :func:`naive_chunk_gated_delta_rule` is the dense chunked form (chunk 64), built from the pieces below so that the
  sparse specification reuses them. Equation numbers are those of SparseGDN (Zhuang et al., arXiv:2610.41420); ``G``
  is the chunk-local cumulative natural-log decay (docs/sparsegdn.md §1):

  - :func:`delta_system`   A_Δ[i,j] = β_i ⟨k_i, k_j⟩ e^(G_i − G_j) for j < i, M = I + A_Δ          (Eq. 5)
  - :func:`solve_intra`    U = M⁻¹ diag(β) V,  W = M⁻¹ diag(β e^G) K                             (Eq. 6)
  - :func:`dense_recurrence` U' = U − W S_c,  S_{c+1} = e^(G_last) S_c + Kᵀ (U' ⊙ e^(G_last − G))  (Eqs. 1–2)
  - :func:`chunk_output`   O = scale · (e^G ⊙ (Q S_c) + (Q Kᵀ ⊙ e^(G_i − G_j) ⊙ causal) U')        (Eqs. 3–4)

The token recurrence, per value head (qk head ``j // (HV / H)``): ``S ← e^(g_t) S``;
``u_t = β_t (v_t − Sᵀ k_t)``; ``S ← S + k_t u_tᵀ``; ``o_t = scale · Sᵀ q_t``.

Internal layout of the chunk pieces: ``[B, HV, C, L, D]`` (C chunks of L tokens). A partial last chunk is padded with
zeros (k = v = β = g = 0), which leaves the state and every real output unchanged.
"""

from __future__ import annotations

import torch

from .checks import GDNProblem, check_gdn_inputs, sequence_bounds

CHUNK = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x²) + eps)`` over the last dim (FLA's ``use_qk_l2norm_in_kernel``)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every narrower float computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def expand_qk_heads(x: torch.Tensor, hv: int) -> torch.Tensor:
    """``[B, T, H, K] -> [B, T, HV, K]``: value head ``j`` reads qk head ``j // (HV / H)``."""
    return x.repeat_interleave(hv // x.shape[2], dim=2)


def prepare_inputs(q, k, v, g, beta, dtype, use_qk_l2norm_in_kernel):
    """Cast to the compute dtype, optionally L2-normalise q/k, expand q/k to the value heads."""
    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    hv = v.shape[2]
    return expand_qk_heads(q, hv), expand_qk_heads(k, hv), v, g, beta


def _run_per_sequence(core, problem: GDNProblem, tensors, initial_state, cu_seqlens, out_dtype):
    """Run ``core(q, k, v, g, beta, state0) -> (o, state)`` on each sequence (or the whole batch) and reassemble."""
    q, k, v, g, beta = tensors
    if cu_seqlens is None:
        o, state = core(q, k, v, g, beta, initial_state)
        return o.to(out_dtype), state
    outs, states = [], []
    for n, (_, s, e) in enumerate(sequence_bounds(problem, cu_seqlens)):
        h0 = None if initial_state is None else initial_state[n : n + 1]
        o, state = core(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], h0)
        outs.append(o)
        states.append(state)
    return torch.cat(outs, dim=1).to(out_dtype), torch.cat(states, dim=0)


def _recurrent_core(q, k, v, g, beta, initial_state, scale):
    B, T, HV, K = k.shape
    V = v.shape[-1]
    S = q.new_zeros(B, HV, K, V) if initial_state is None else initial_state.to(q.dtype).clone()
    o = q.new_empty(B, T, HV, V)
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], S))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        o[:, t] = scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S)
    return o, S


def naive_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token gated delta rule, the definition every other path is checked against.

    Args:
        q, k: ``[B, T, H, K]``. v: ``[B, T, HV, V]``, ``HV`` a multiple of ``H``.
        g: ``[B, T, HV]`` natural-log per-token decay (≤ 0 for a forgetting gate). beta: ``[B, T, HV]``.
        scale: output scale, default ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]``, N sequences. output_final_state: also return the state after the last token.
        use_qk_l2norm_in_kernel: L2-normalise q and k first (eps 1e-6).
        cu_seqlens: ``[N + 1]`` packed sequence offsets (B == 1); each sequence starts from its own initial state.

    Returns:
        ``(o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] in the compute dtype or None)``. Computes in float64
        for float64 inputs and in float32 otherwise.
    """
    problem = check_gdn_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens)
    scale = problem.K**-0.5 if scale is None else scale
    dtype = compute_dtype(q.dtype)
    tensors = prepare_inputs(q, k, v, g, beta, dtype, use_qk_l2norm_in_kernel)

    def core(q, k, v, g, beta, h0):
        return _recurrent_core(q, k, v, g, beta, h0, scale)

    o, state = _run_per_sequence(core, problem, tensors, initial_state, cu_seqlens, q.dtype)
    return o, (state if output_final_state else None)


def to_chunks(x: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """``[B, T, HV, *D] -> [B, HV, C, L, *D]`` with zero padding of the last chunk."""
    B, T = x.shape[:2]
    C = max(1, -(-T // chunk))
    pad = C * chunk - T
    x = x.movedim(2, 1)  # [B, HV, T, *D]
    if pad:
        x = torch.cat([x, x.new_zeros(*x.shape[:2], pad, *x.shape[3:])], dim=2)
    return x.reshape(*x.shape[:2], C, chunk, *x.shape[3:])


def from_chunks(x: torch.Tensor, T: int) -> torch.Tensor:
    """``[B, HV, C, L, *D] -> [B, T, HV, *D]``, dropping the padding."""
    x = x.reshape(*x.shape[:2], -1, *x.shape[4:])[:, :, :T]
    return x.movedim(1, 2)


def chunk_cumsum(g: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """Chunk-local cumulative decay ``G [B, HV, C, L]`` from per-token ``g [B, T, HV]`` (padding has g = 0)."""
    return to_chunks(g, chunk).cumsum(-1)


def causal_decay(G_rows: torch.Tensor, G_cols: torch.Tensor, strict: bool) -> torch.Tensor:
    """``e^(G_i − G_j)`` on the causal triangle (``j < i`` if strict else ``j ≤ i``), 0 elsewhere; ``[..., L, L]``.

    The exponent is masked before ``exp`` so that the unused upper triangle cannot overflow.
    """
    L = G_rows.shape[-1]
    tri = torch.ones(L, L, dtype=torch.bool, device=G_rows.device).tril(-1 if strict else 0)
    diff = G_rows[..., :, None] - G_cols[..., None, :]
    return torch.where(tri, diff, torch.full_like(diff, float("-inf"))).exp()


def delta_system(k: torch.Tensor, beta: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Strictly lower ``A_Δ [B, HV, C, L, L]``: ``β_i ⟨k_i, k_j⟩ e^(G_i − G_j)`` for ``j < i``.

    k: ``[B, HV, C, L, K]``, beta and G: ``[B, HV, C, L]``. The unit lower-triangular system is ``M = I + A_Δ``.
    """
    return beta[..., :, None] * (k @ k.transpose(-1, -2)) * causal_decay(G, G, strict=True)


def solve_intra(k, v, beta, G) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact local solve: ``U = M⁻¹ diag(β) V`` ``[B, HV, C, L, V]`` and ``W = M⁻¹ diag(β e^G) K`` ``[.., L, K]``."""
    M = delta_system(k, beta, G) + torch.eye(k.shape[-2], dtype=k.dtype, device=k.device)
    rhs = torch.cat([beta[..., None] * v, (beta * G.exp())[..., None] * k], dim=-1)
    sol = torch.linalg.solve_triangular(M, rhs, upper=False, unitriangular=True)
    return sol[..., : v.shape[-1]], sol[..., v.shape[-1] :]


def state_step(S: torch.Tensor, k_c: torch.Tensor, G_c: torch.Tensor, u_new: torch.Tensor) -> torch.Tensor:
    """One chunk of state update: ``e^(G_last) S + Kᵀ (U' ⊙ e^(G_last − G))``.

    S: ``[B, HV, K, V]``; k_c: ``[B, HV, L, K]``; G_c: ``[B, HV, L]``; u_new (U'): ``[B, HV, L, V]``.
    """
    g_last = G_c[..., -1:]
    return g_last[..., None].exp() * S + k_c.transpose(-1, -2) @ (u_new * (g_last - G_c).exp()[..., None])


def dense_recurrence(k, G, U, W, initial_state=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every chunk reads and writes the state.

    Returns ``S_in [B, HV, C, K, V]`` (the state entering each chunk), ``U' [B, HV, C, L, V]`` and the final state.
    """
    B, HV, C, L, K = k.shape
    V = U.shape[-1]
    S = k.new_zeros(B, HV, K, V) if initial_state is None else initial_state.to(k.dtype)
    S_in = k.new_empty(B, HV, C, K, V)
    U_new = torch.empty_like(U)
    for c in range(C):
        S_in[:, :, c] = S
        U_new[:, :, c] = U[:, :, c] - W[:, :, c] @ S
        S = state_step(S, k[:, :, c], G[:, :, c], U_new[:, :, c])
    return S_in, U_new, S


def chunk_output(q, k, G, S_in, U_new, scale: float) -> torch.Tensor:
    """``O = scale · (e^G ⊙ (Q S_c) + (Q Kᵀ ⊙ e^(G_i − G_j) ⊙ [j ≤ i]) U')`` per chunk, ``[B, HV, C, L, V]``."""
    inter = G.exp()[..., None] * (q @ S_in)
    intra = ((q @ k.transpose(-1, -2)) * causal_decay(G, G, strict=False)) @ U_new
    return scale * (inter + intra)


def _chunk_core(q, k, v, g, beta, initial_state, scale):
    T = q.shape[1]
    G = chunk_cumsum(g)
    qc, kc, vc, bc = to_chunks(q), to_chunks(k), to_chunks(v), to_chunks(beta)
    U, W = solve_intra(kc, vc, bc, G)
    S_in, U_new, S_final = dense_recurrence(kc, G, U, W, initial_state)
    return from_chunks(chunk_output(qc, kc, G, S_in, U_new, scale), T), S_final


def naive_chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Dense chunked gated delta rule (chunk 64, exact local solve); same arguments and results as
    :func:`naive_recurrent_gated_delta_rule`, vectorised over batch, heads and chunks except the state recurrence."""
    problem = check_gdn_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens)
    scale = problem.K**-0.5 if scale is None else scale
    dtype = compute_dtype(q.dtype)
    tensors = prepare_inputs(q, k, v, g, beta, dtype, use_qk_l2norm_in_kernel)

    def core(q, k, v, g, beta, h0):
        if q.shape[1] == 0:
            B, _, HV, K = k.shape
            S = q.new_zeros(B, HV, K, v.shape[-1]) if h0 is None else h0.to(q.dtype)
            return q.new_empty(B, 0, HV, v.shape[-1]), S
        return _chunk_core(q, k, v, g, beta, h0, scale)

    o, state = _run_per_sequence(core, problem, tensors, initial_state, cu_seqlens, q.dtype)
    return o, (state if output_final_state else None)


__all__ = [
    "naive_recurrent_gated_delta_rule",
    "naive_chunk_gated_delta_rule",
    "l2norm",
    "to_chunks",
    "from_chunks",
    "chunk_cumsum",
    "causal_decay",
    "delta_system",
    "solve_intra",
    "state_step",
    "dense_recurrence",
    "chunk_output",
]
