"""The short causal convolution's entry point: argument checks, the Triton launch, the new conv states."""

from __future__ import annotations

import torch

from .._launch import fast
from .._triton import forward_kernel_choice
from ..sparse_attn.checks import check_tensor, shape_str
from ..sparse_attn.launch import load_kernels
from .naive import causal_conv1d_ref

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK_TOKENS = 16  # 16 x 128 tiles at 4 warps: 96 registers (153 with conv states), no spills (sm_90)
BLOCK_CHANNELS = 128


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    offsets: list[int],
    initial_states: torch.Tensor | None = None,
    *,
    activation: str | None = "silu",
    use_kernel: bool | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution of packed sequences: ``x [T, C]`` (last dim contiguous), ``weight [C, W]``,
    ``offsets`` the host list of sequence boundaries (``[0, …, T]``), ``initial_states [N, C, W − 1]`` the inputs
    that preceded each sequence (None: zeros) -> ``(y [T, C], final_states [N, C, W − 1])`` in ``x``'s dtype.

    ``activation``: ``"silu"`` or None. ``use_kernel``: None runs the Triton kernel where it can run (a GPU, or
    Triton's interpreter for CPU tensors), True requires it, False runs the torch reference. The kernel has no
    backward: when autograd would need one (grad enabled and an input that requires grad), the differentiable torch
    reference runs instead, and ``use_kernel=True`` is refused. ``cu_seqlens``: the same boundaries as an integer
    tensor on ``x``'s device, when the caller has them there (a model step does): the kernel path then copies
    nothing from the host.
    """
    check_tensor("x", x, 2, "[T, C]")
    check_tensor("weight", weight, 2, "[C, W]")
    T, C = x.shape
    W = weight.shape[1]
    if weight.shape[0] != C:
        raise ValueError(f"weight must be [C, W] with C = {C} (as x {shape_str(x)}), got {shape_str(weight)}")
    if W < 1:
        raise ValueError(f"the convolution needs at least one tap, got weight {shape_str(weight)}")
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device}, x on {x.device}")
    offsets = [int(o) for o in offsets]
    if len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != T or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"offsets must rise from 0 to T = {T}, got {offsets[:8]}{'…' if len(offsets) > 8 else ''}")
    N = len(offsets) - 1
    if initial_states is not None:
        check_tensor("initial_states", initial_states, 3, "[N, C, W - 1]")
        if tuple(initial_states.shape) != (N, C, W - 1):
            raise ValueError(f"initial_states must be [N, C, W - 1] = [{N}, {C}, {W - 1}], got "
                             f"{shape_str(initial_states)}")  # fmt: skip
        if initial_states.device != x.device:
            raise ValueError(f"initial_states is on {initial_states.device}, x on {x.device}")
    if activation not in ("silu", None):
        raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
    tensors = (x, weight) if initial_states is None else (x, weight, initial_states)
    if not forward_kernel_choice(use_kernel, *tensors, dtypes=KERNEL_DTYPES):
        return causal_conv1d_ref(x, weight, offsets, initial_states, activation)
    if x.stride(1) != 1:
        x = x.contiguous()
    y = torch.empty(T, C, dtype=x.dtype, device=x.device)
    if cu_seqlens is None or cu_seqlens.device != x.device or cu_seqlens.numel() != N + 1:
        cu_seqlens = torch.tensor(offsets, device=x.device)  # (a small copy from the host)
    cu = cu_seqlens.to(torch.int32)
    lengths = cu[1:] - cu[:-1]
    tok_start = torch.repeat_interleave(cu[:-1], lengths, output_size=T)
    tok_seq = torch.repeat_interleave(torch.arange(N, dtype=torch.int32, device=x.device), lengths, output_size=T)
    # the kernel reads a state's W - 1 inputs at unit stride (a state returned by an earlier call is a transposed view)
    states = initial_states.contiguous() if initial_states is not None else y  # y: a placeholder, never read
    if T and C:
        grid = (-(-T // BLOCK_TOKENS), -(-C // BLOCK_CHANNELS))
        fast(load_kernels("conv", __package__).conv_fwd_kernel)[grid](
            x, weight.contiguous(), states, y, tok_start, tok_seq, T, C,
            x.stride(0), y.stride(0), states.stride(0), states.stride(1),
            W=W, BT=BLOCK_TOKENS, BC=BLOCK_CHANNELS, HAS_STATE=initial_states is not None,
            SILU=activation == "silu", num_warps=4,
        )  # fmt: skip
    return y, final_states(x, cu, initial_states, W)


def final_states(x: torch.Tensor, cu: torch.Tensor, initial_states: torch.Tensor | None, W: int) -> torch.Tensor:
    """Each sequence's last ``W − 1`` inputs ``[N, C, W − 1]`` (oldest first; ``cu [N + 1]`` the boundaries on
    ``x``'s device), reaching into its initial state (or zeros) when the sequence is shorter than that. Device-side
    gathers, no host synchronisation."""
    N, C = cu.numel() - 1, x.shape[1]
    if W == 1:
        return x.new_empty(N, C, 0)
    tail = torch.arange(W - 1, device=x.device) - (W - 1)  # -(W-1) … -1
    ends = cu[1:].long()[:, None]
    starts = cu[:-1].long()[:, None]
    pos = ends + tail  # [N, W - 1] positions in x
    from_x = x[pos.clamp(min=0)].transpose(1, 2) if x.shape[0] else x.new_zeros(N, C, W - 1)  # [N, C, W - 1]
    prev = initial_states.to(x.dtype) if initial_states is not None else x.new_zeros(N, C, W - 1)
    from_prev = prev.gather(2, (pos - starts + (W - 1)).clamp(min=0, max=W - 2)[:, None, :].expand(N, C, W - 1))
    return torch.where((pos >= starts)[:, None, :], from_x, from_prev).contiguous()
