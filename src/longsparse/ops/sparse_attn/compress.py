"""Compressed keys for block selection: a prefill kernel and an incremental decode step.

``K̃_j = mean(K[j·s : j·s + l])`` (window ``l = kernel_size``, stride ``s = kernel_stride``, full windows only), per
batch row and KV head, computed in float32 and stored in the keys' dtype (MiniCPM4's ``CompressK``).

Both kernels add a window's keys one by one in position order in float32 and divide by ``l`` at the end, so the
incremental decode step reproduces the prefill kernel bit for bit (the tests check ``torch.equal``).

Decode state per layer (what the offloaded cache keeps on the GPU):

* ``k_cmp [B, Ncap, Hkv, d]`` — compressed keys, ``Ncap ≥ num_compressed(max length)``; a step that would write past
  ``Ncap`` writes nothing (the kernel cannot raise without a host sync; size the buffer from the length limit).
* ``ring [B, l, Hkv, d]`` — the last ``l`` keys, the key of position ``p`` in slot ``p % l``
  (:func:`fill_compress_ring` after prefill).

A step appends the key of position ``p = cache_seqlens[b]`` and, when it completes a window
(``p + 1 ≥ l`` and ``(p + 1 − l) % s == 0``), writes ``K̃_{(p + 1 − l) / s}``: one new key every ``s`` tokens.
"""

from __future__ import annotations

import torch

from .._launch import fast
from .checks import check_compression, check_cu_seqlens, check_same_device, check_tensor, use_kernels
from .launch import last_dim_contiguous, load_kernels, next_pow2
from .naive import compress_decode_step_ref, compress_keys_ref


def compress_keys(
    k: torch.Tensor,
    kernel_size: int = 32,
    kernel_stride: int = 16,
    cu_seqlens: torch.Tensor | None = None,
    *,
    use_kernel: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Compressed keys of ``k [B, T, Hkv, d]``: ``[B, N, Hkv, d]`` in ``k``'s dtype, ``N = (T − l) // s + 1``.

    With ``cu_seqlens`` (``B == 1``) every packed sequence is compressed on its own and the result is packed; the
    second return value is then the compressed ``cu_seqlens`` (the kernel is launched once per sequence, which reads
    ``cu_seqlens`` on the host), else None. ``use_kernel``: None = Triton when it can run here, else the reference.
    """
    check_tensor("k", k, 4, "[B, T, Hkv, d]")
    check_compression(kernel_size, kernel_stride)
    if not use_kernels(k.device, k.dtype, use_kernel):
        return compress_keys_ref(k, kernel_size, kernel_stride, cu_seqlens)
    if cu_seqlens is not None:
        offsets = check_cu_seqlens(cu_seqlens, k.shape[0], k.shape[1])
        parts = [_compress_launch(k[:, s:e], kernel_size, kernel_stride) for s, e in zip(offsets, offsets[1:])]
        counts = [0]
        for p in parts:
            counts.append(counts[-1] + p.shape[1])
        return torch.cat(parts, dim=1), torch.tensor(counts, dtype=torch.int32, device=k.device)
    return _compress_launch(k, kernel_size, kernel_stride), None


def _compress_launch(k: torch.Tensor, kernel_size: int, kernel_stride: int) -> torch.Tensor:
    B, T, H, D = k.shape
    N = 0 if T < kernel_size else (T - kernel_size) // kernel_stride + 1
    out = torch.empty(B, N, H, D, dtype=k.dtype, device=k.device)
    if N == 0 or B * H == 0:
        return out
    k = last_dim_contiguous(k)
    prefill_kernel = load_kernels("compress").compress_fwd_kernel_prefill
    BJ = 16
    fast(prefill_kernel)[(-(-N // BJ), B * H)](
        k,
        out,
        N,
        k.stride(0),
        k.stride(1),
        k.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        H=H,
        D=D,
        KS=kernel_size,
        ST=kernel_stride,
        BJ=BJ,
        BD=next_pow2(D),
        num_warps=4,
    )
    return out


def compress_decode_step(
    k_new: torch.Tensor,
    ring: torch.Tensor,
    k_cmp: torch.Tensor,
    cache_seqlens: torch.Tensor,
    kernel_size: int = 32,
    kernel_stride: int = 16,
    *,
    use_kernel: bool | None = None,
) -> None:
    """Append one key per sequence and add a compressed key whenever a window completes (in place, no host sync).

    ``k_new [B, Hkv, d]`` is the key at position ``cache_seqlens[b]`` (tokens cached before this step);
    ``ring [B, kernel_size, Hkv, d]`` and ``k_cmp [B, Ncap, Hkv, d]`` are the decode state described in the module
    docstring. The caller advances ``cache_seqlens`` afterwards.
    """
    check_tensor("k_new", k_new, 3, "[B, Hkv, d]")
    check_tensor("ring", ring, 4, "[B, kernel_size, Hkv, d]")
    check_tensor("k_cmp", k_cmp, 4, "[B, Ncap, Hkv, d]")
    check_tensor("cache_seqlens", cache_seqlens, 1, "[B]", floating=False)
    check_same_device(k_new=k_new, ring=ring, k_cmp=k_cmp, cache_seqlens=cache_seqlens)
    B, H, D = k_new.shape
    if ring.shape != (B, kernel_size, H, D):
        raise ValueError(
            f"ring must be [B, kernel_size, Hkv, d] = [{B}, {kernel_size}, {H}, {D}], got {list(ring.shape)}"
        )
    if k_cmp.shape[0] != B or k_cmp.shape[2:] != (H, D):
        raise ValueError(f"k_cmp must be [B, Ncap, Hkv, d] with B={B}, Hkv={H}, d={D}, got {list(k_cmp.shape)}")
    if cache_seqlens.shape != (B,):
        raise ValueError(f"cache_seqlens must be [B] = [{B}], got {list(cache_seqlens.shape)}")
    check_compression(kernel_size, kernel_stride)
    if not use_kernels(k_new.device, k_new.dtype, use_kernel):
        compress_decode_step_ref(k_new, ring, k_cmp, cache_seqlens, kernel_size, kernel_stride)
        return
    for name, x in (("ring", ring), ("k_cmp", k_cmp), ("k_new", k_new)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim (it is written in place)")
    decode_kernel = load_kernels("compress").compress_fwd_kernel_decode
    fast(decode_kernel)[(B * H,)](
        k_new,
        ring,
        k_cmp,
        cache_seqlens,
        k_cmp.shape[1],
        k_new.stride(0),
        k_new.stride(1),
        ring.stride(0),
        ring.stride(1),
        ring.stride(2),
        k_cmp.stride(0),
        k_cmp.stride(1),
        k_cmp.stride(2),
        H=H,
        D=D,
        KS=kernel_size,
        ST=kernel_stride,
        BD=next_pow2(D),
        num_warps=1,
    )


def fill_compress_ring(k: torch.Tensor, lengths: torch.Tensor, ring: torch.Tensor) -> None:
    """After prefill: put the last ``kernel_size`` keys of each sequence into ``ring`` (slot ``p % kernel_size``).

    ``k [B, T, Hkv, d]`` holds sequence ``b`` in ``k[b, :lengths[b]]``; ``ring [B, kernel_size, Hkv, d]``.
    Slots of positions before 0 (sequences shorter than the window) are left as they are. No host sync.
    """
    check_tensor("k", k, 4, "[B, T, Hkv, d]")
    check_tensor("ring", ring, 4, "[B, kernel_size, Hkv, d]")
    check_tensor("lengths", lengths, 1, "[B]", floating=False)
    B, T, H, D = k.shape
    ks = ring.shape[1]
    if ring.shape != (B, ks, H, D) or lengths.shape != (B,):
        raise ValueError(
            f"ring must be [B, l, Hkv, d] = [{B}, l, {H}, {D}] and lengths [B], got "
            f"ring {list(ring.shape)} and lengths {list(lengths.shape)}"
        )
    pos = lengths.long()[:, None] - ks + torch.arange(ks, device=k.device)[None, :]  # [B, ks]
    valid = pos >= 0
    src = k.gather(1, pos.clamp(0, max(T - 1, 0))[:, :, None, None].expand(B, ks, H, D))
    slot = pos.remainder(ks)
    cur = ring.gather(1, slot[:, :, None, None].expand(B, ks, H, D))
    ring.scatter_(1, slot[:, :, None, None].expand(B, ks, H, D), torch.where(valid[:, :, None, None], src, cur))
