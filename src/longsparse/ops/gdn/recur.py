"""SparseGDN event-sparse recurrence on the GPU (CSR rows of selected events, deferred W, compact snapshots).

One program per (row, value head of the row's pair, V tile); a row is one (sequence, head pair) and lists its selected
chunks in time order. The state tile ``S [K, BV]`` stays in registers (fp32). For each selected chunk ``c``:

    S ← e^{P_c − P_after} S                              bridge the skipped chunks (decay only)
    W_i = Cbar_ii K_i + Cbar_{i,i-1} K_{i-1}              deferred W, built here for selected chunks only
    U'_c = U_c − W S                                      read correction, written over U in place
    S ← e^{γ_c} S + K_cᵀ (U'_c ⊙ e^{γ_c − G_c})           write

and the state after the event is stored to its snapshot slot when some output group reads it. After the last event the
state is bridged to the end of the sequence and stored as the final state.
"""

from __future__ import annotations

import torch

from ..._optional import require

triton = require("triton", "SparseGDN's GPU kernels")
import triton.language as tl  # noqa: E402

from .intra import _rows, _vec  # noqa: E402


@triton.jit
def _cbar_block(ptr, idx: tl.constexpr):
    o = tl.arange(0, 16)
    return tl.load(ptr + idx * 256 + o[:, None] * 16 + o[None, :])


@triton.jit
def _mm(a, b, IEEE: tl.constexpr):
    """Product with fp32 accumulation; operands arrive in the input dtype (fp32 only in IEEE mode)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def sparse_gdn_fwd_kernel_recur(
    k,
    u,
    cbar,
    gcum,
    gamma,
    prefix,
    h0,
    snaps,
    ht,
    row_ptr,
    row_seq,
    row_pair,
    event_chunk,
    event_snap,
    chunk_bos,
    chunk_len,
    seq_last_chunk,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    HAS_H0: tl.constexpr,
    STORE_FINAL: tl.constexpr,
    IEEE: tl.constexpr,
):
    i_r = tl.program_id(0)
    i_j = tl.program_id(1)
    i_v = tl.program_id(2)
    GS: tl.constexpr = HV // H
    n_seq = tl.load(row_seq + i_r)
    i_h = tl.load(row_pair + i_r)
    i_hv = i_h * GS + i_j
    offs_k = tl.arange(0, K)
    offs_v = i_v * BV + tl.arange(0, BV)
    o16 = tl.arange(0, 16)

    S = tl.zeros([K, BV], dtype=tl.float32)
    if HAS_H0:
        p_h0 = h0 + ((n_seq * HV + i_hv).to(tl.int64) * K + offs_k[:, None]) * V + offs_v[None, :]
        S = tl.load(p_h0).to(tl.float32)
    p_after = tl.full([], 0.0, tl.float64)  # prefix of γ (float64) up to the point S describes: the sequence start

    e_start = tl.load(row_ptr + i_r)
    e_end = tl.load(row_ptr + i_r + 1)
    for e in range(e_start, e_end):
        c = tl.load(event_chunk + e)
        bos = tl.load(chunk_bos + c).to(tl.int64)
        n = tl.load(chunk_len + c)
        p_c = tl.load(prefix + c.to(tl.int64) * HV + i_hv)
        g_c = tl.load(gamma + c.to(tl.int64) * HV + i_hv)
        S = S * tl.exp((p_c - p_after).to(tl.float32))
        p_after = p_c + g_c.to(tl.float64)

        k_base = k + bos * (H * K) + i_h * K
        k0 = _rows(k_base, 0, n, H * K, offs_k, K)
        k1 = _rows(k_base, 16, n, H * K, offs_k, K)
        k2 = _rows(k_base, 32, n, H * K, offs_k, K)
        k3 = _rows(k_base, 48, n, H * K, offs_k, K)
        cb = cbar + (c.to(tl.int64) * HV + i_hv) * (7 * 256)
        kd = k.dtype.element_ty
        w0 = _mm(_cbar_block(cb, 0).to(kd), k0, IEEE)
        w1 = _mm(_cbar_block(cb, 1).to(kd), k1, IEEE) + _mm(_cbar_block(cb, 4).to(kd), k0, IEEE)
        w2 = _mm(_cbar_block(cb, 2).to(kd), k2, IEEE) + _mm(_cbar_block(cb, 5).to(kd), k1, IEEE)
        w3 = _mm(_cbar_block(cb, 3).to(kd), k3, IEEE) + _mm(_cbar_block(cb, 6).to(kd), k2, IEEE)

        u_base = u + bos * (HV * V) + i_hv * V
        Sd = S.to(kd)
        u0 = _rows(u_base, 0, n, HV * V, offs_v, V).to(tl.float32) - _mm(w0.to(kd), Sd, IEEE)
        u1 = _rows(u_base, 16, n, HV * V, offs_v, V).to(tl.float32) - _mm(w1.to(kd), Sd, IEEE)
        u2 = _rows(u_base, 32, n, HV * V, offs_v, V).to(tl.float32) - _mm(w2.to(kd), Sd, IEEE)
        u3 = _rows(u_base, 48, n, HV * V, offs_v, V).to(tl.float32) - _mm(w3.to(kd), Sd, IEEE)
        ud = u.dtype.element_ty
        p_u = u_base + o16.to(tl.int64)[:, None] * (HV * V) + offs_v[None, :]
        tl.store(p_u, u0.to(ud), mask=(o16 < n)[:, None])
        tl.store(p_u + 16 * HV * V, u1.to(ud), mask=(16 + o16 < n)[:, None])
        tl.store(p_u + 32 * HV * V, u2.to(ud), mask=(32 + o16 < n)[:, None])
        tl.store(p_u + 48 * HV * V, u3.to(ud), mask=(48 + o16 < n)[:, None])

        gb = gcum + bos * HV + i_hv
        d0 = tl.exp(g_c - _vec(gb, 0, n, HV))
        d1 = tl.exp(g_c - _vec(gb, 16, n, HV))
        d2 = tl.exp(g_c - _vec(gb, 32, n, HV))
        d3 = tl.exp(g_c - _vec(gb, 48, n, HV))
        S = S * tl.exp(g_c)
        S += _mm(tl.trans(k0), (u0 * d0[:, None]).to(kd), IEEE)
        S += _mm(tl.trans(k1), (u1 * d1[:, None]).to(kd), IEEE)
        S += _mm(tl.trans(k2), (u2 * d2[:, None]).to(kd), IEEE)
        S += _mm(tl.trans(k3), (u3 * d3[:, None]).to(kd), IEEE)

        slot = tl.load(event_snap + e)
        if slot >= 0:
            p_s = snaps + ((slot.to(tl.int64) * GS + i_j) * K + offs_k[:, None]) * V + offs_v[None, :]
            tl.store(p_s, S.to(snaps.dtype.element_ty))

    if STORE_FINAL:
        c_last = tl.load(seq_last_chunk + n_seq)
        if c_last >= 0:
            p_end = tl.load(prefix + c_last.to(tl.int64) * HV + i_hv) + tl.load(gamma + c_last.to(tl.int64) * HV + i_hv)
            S = S * tl.exp((p_end - p_after).to(tl.float32))
        p_ht = ht + ((n_seq * HV + i_hv).to(tl.int64) * K + offs_k[:, None]) * V + offs_v[None, :]
        tl.store(p_ht, S)
