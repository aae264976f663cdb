"""Input validation shared by every gated-delta-rule entry point (references, sparse spec, kernels)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class GDNProblem:
    """Sizes of one gated-delta-rule call.

    ``B`` batch, ``T`` tokens per row, ``H`` qk heads, ``HV`` value heads (a multiple of ``H``), ``K``/``V`` head
    dims, ``N`` independent sequences (``B`` without ``cu_seqlens``, ``len(cu_seqlens) - 1`` with it); ``offsets``
    the values of ``cu_seqlens`` on the host, as the checks read them (None without it), so that later steps of the
    call need not read the tensor again.
    """

    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    N: int
    offsets: tuple[int, ...] | None = field(default=None, repr=False)

    @property
    def group(self) -> int:
        """Value heads per qk head: value head ``j`` reads qk head ``j // group``."""
        return self.HV // self.H


def _shape(x: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in x.shape) + "]"


def check_gdn_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    offsets: list[int] | None = None,
) -> GDNProblem:
    """Check FLA-layout gated-delta-rule inputs and return their sizes; raise ValueError naming what is wrong.

    Expected: ``q, k [B, T, H, K]``, ``v [B, T, HV, V]`` with ``HV % H == 0``, ``g, beta [B, T, HV]``, all floating
    point and on one device; ``initial_state [N, HV, K, V]``; ``cu_seqlens`` a 1-D integer tensor
    ``[0, ..., T]`` (non-decreasing) that requires ``B == 1``. ``offsets``: ``cu_seqlens``'s values already on the
    host (a launch plan's copy), checked instead of reading the tensor — on a GPU that read waits for the device.
    """
    named = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    for name, want in (("q", 4), ("k", 4), ("v", 4), ("g", 3), ("beta", 3)):
        if named[name].dim() != want:
            layout = "[B, T, HV]" if want == 3 else ("[B, T, HV, V]" if name == "v" else "[B, T, H, K]")
            raise ValueError(f"{name} must be {want}-D {layout}, got shape {_shape(named[name])}")
    for name, x in named.items():
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    devices = {name: x.device for name, x in named.items()}
    if initial_state is not None:
        devices["initial_state"] = initial_state.device
    if cu_seqlens is not None:
        devices["cu_seqlens"] = cu_seqlens.device
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape [B, T, H, K], got q {_shape(q)} and k {_shape(k)}")
    B, T, H, K = q.shape
    if v.shape[:2] != (B, T):
        raise ValueError(f"v must be [B, T, HV, V] with B, T as in q {_shape(q)}, got v {_shape(v)}")
    HV, V = v.shape[2], v.shape[3]
    if H == 0 or HV % H != 0:
        raise ValueError(f"the value heads HV={HV} (v {_shape(v)}) must be a multiple of the qk heads H={H}")
    for name in ("g", "beta"):
        if named[name].shape != (B, T, HV):
            raise ValueError(f"{name} must be [B, T, HV] = [{B}, {T}, {HV}], got {_shape(named[name])}")
    if scale is not None and not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"scale must be a positive number, got {scale!r}")

    N = B
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point():
            raise ValueError("cu_seqlens must be a 1-D integer tensor of cumulative sequence lengths [N + 1]")
        if B != 1:
            raise ValueError(f"cu_seqlens requires batch size 1 (sequences packed along T), got B={B}")
        if cu_seqlens.numel() < 2:
            raise ValueError("cu_seqlens must hold at least two offsets [0, T]")
        offsets = cu_seqlens.tolist() if offsets is None else offsets
        if offsets[0] != 0 or offsets[-1] != T:
            raise ValueError(f"cu_seqlens must start at 0 and end at T={T}, got {offsets[0]} ... {offsets[-1]}")
        if any(b < a for a, b in zip(offsets, offsets[1:])):
            raise ValueError("cu_seqlens must be non-decreasing")
        N = len(offsets) - 1
        offsets = tuple(offsets)
    if initial_state is not None:
        if initial_state.shape != (N, HV, K, V):
            raise ValueError(
                f"initial_state must be [N, HV, K, V] = [{N}, {HV}, {K}, {V}], got {_shape(initial_state)}"
            )
        if not initial_state.is_floating_point():
            raise ValueError(f"initial_state must be floating point, got dtype {initial_state.dtype}")
    return GDNProblem(B=B, T=T, H=H, HV=HV, K=K, V=V, N=N, offsets=offsets if cu_seqlens is not None else None)


def sequence_bounds(problem: GDNProblem, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int, int]]:
    """``(row, start, end)`` of every sequence: the batch rows, or the packed spans of ``cu_seqlens``."""
    if cu_seqlens is None:
        return [(b, 0, problem.T) for b in range(problem.B)]
    offsets = cu_seqlens.tolist()
    return [(0, s, e) for s, e in zip(offsets, offsets[1:])]


def check_gate_inputs(
    problem: GDNProblem,
    v: torch.Tensor,
    gate: torch.Tensor | None,
    gate_norm_weight: torch.Tensor | None,
) -> None:
    """Check SparseGDN's output-gate inputs: ``gate [B, T, HV, V]`` (pre-activation z) and ``gate_norm_weight [V]``
    (the gated RMSNorm weight), floating point and on v's device; a weight without a gate is an error."""
    if gate is None:
        if gate_norm_weight is not None:
            raise ValueError("gate_norm_weight was given without gate; pass the pre-activation output gate z too")
        return
    want = (problem.B, problem.T, problem.HV, problem.V)
    named = (("gate", gate, "[B, T, HV, V]", want), ("gate_norm_weight", gate_norm_weight, "[V]", (problem.V,)))
    for name, x, layout, shape in named:
        if x is None:
            continue
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} must be {layout} = [{', '.join(map(str, shape))}], got {_shape(x)}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
        if x.device != v.device:
            raise ValueError(f"{name} must be on v's device {v.device}, got {x.device}")
