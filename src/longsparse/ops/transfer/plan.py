"""The copy planner: one layer's block selection against its resident dynamic slots -> block table + copy tasks.

Semantics: ``naive.plan_slot_copies_ref`` (slot layout and the hit / free / rank-to-rank assignment rules in the
docstring of ``naive.py``). On a GPU one Triton launch plans every (sequence, KV head) row and writes the tasks and
their count into a :class:`CopyPlan`'s persistent buffers, which the copy kernel reads on the transfer stream — no
host sync anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._launch import fast
from .._triton import kernels_can_run_on
from ..sparse_attn.checks import check_tensor, shape_str
from ..sparse_attn.launch import load_kernels, next_pow2
from .naive import STAT_FIELDS, SlotMap, plan_slot_copies_ref


@dataclass(frozen=True)
class CopyPlan:
    """Buffers one layer's plan writes and its copy reads, allocated once and reused every step.

    ``table [max_rows · width]`` int32 (viewed ``[N, Hkv, width]``), ``src`` / ``dst [max_rows · dynamic_slots]``
    int64 task rows, ``count [1]`` int32 tasks in ``src`` / ``dst``. ``max_rows`` = sequences × KV heads.
    """

    table: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    count: torch.Tensor
    width: int

    @classmethod
    def allocate(cls, max_rows: int, width: int, dynamic_slots: int, device: torch.device | str) -> CopyPlan:
        return cls(
            table=torch.full((max_rows * width,), -1, dtype=torch.int32, device=device),
            src=torch.zeros(max(1, max_rows * dynamic_slots), dtype=torch.int64, device=device),
            dst=torch.zeros(max(1, max_rows * dynamic_slots), dtype=torch.int64, device=device),
            count=torch.zeros(1, dtype=torch.int32, device=device),
            width=width,
        )

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.table, self.src, self.dst, self.count))


def plan_slot_copies(
    selection: torch.Tensor,
    seqlens: torch.Tensor,
    seq_slots: torch.Tensor,
    resident: torch.Tensor,
    slot_map: SlotMap,
    plan: CopyPlan,
    stats: torch.Tensor,
    *,
    use_kernel: bool | None = None,
) -> torch.Tensor:
    """Plan one layer's step; returns the block table ``[N, Hkv, W]`` int32 (a view of ``plan.table``).

    ``selection [N, Hkv, W]`` int (selected blocks incl. forced ones, −1 padded), ``seqlens [N]`` (tokens incl. the
    new one), ``seq_slots [N]`` (cache sequence slot of each row), ``resident [S·Hkv, C]`` int32 (updated in place),
    all on one device with ``plan``; ``stats [4]`` int64 accumulates :data:`~.naive.STAT_FIELDS`. Writes
    ``plan.src / dst / count``.
    """
    check_tensor("selection", selection, 3, "[N, Hkv, W]", floating=False)
    check_tensor("seqlens", seqlens, 1, "[N]", floating=False)
    check_tensor("seq_slots", seq_slots, 1, "[N]", floating=False)
    check_tensor("resident", resident, 2, "[S·Hkv, C]", floating=False)
    check_tensor("stats", stats, 1, "[4]", floating=False)
    N, H, W = selection.shape
    C = slot_map.dynamic_slots
    if H != slot_map.num_kv_heads:
        raise ValueError(f"selection has {H} KV heads, the slot map {slot_map.num_kv_heads}")
    if seqlens.shape != (N,) or seq_slots.shape != (N,):
        raise ValueError(
            f"seqlens and seq_slots must be [N] = [{N}], got {shape_str(seqlens)} and {shape_str(seq_slots)}"
        )
    if resident.dtype != torch.int32 or resident.shape[1] != C or resident.shape[0] % H:
        raise ValueError(
            f"resident must be int32 [S·Hkv, C={C}] with Hkv={H}, got {resident.dtype} {shape_str(resident)}"
        )
    if resident.stride(1) != 1:
        raise ValueError("resident must be contiguous in its last dim")
    if stats.shape != (len(STAT_FIELDS),) or stats.dtype != torch.int64:
        raise ValueError(f"stats must be int64 [{len(STAT_FIELDS)}], got {stats.dtype} {shape_str(stats)}")
    if W != plan.width or N * H * W > plan.table.numel():
        raise ValueError(
            f"selection {shape_str(selection)} does not fit the plan buffers (width {plan.width}, "
            f"{plan.table.numel() // plan.width} rows)"
        )
    device = selection.device
    for name, t in (("seqlens", seqlens), ("seq_slots", seq_slots), ("resident", resident), ("stats", stats),
                    ("plan.table", plan.table)):  # fmt: skip
        if t.device != device:
            raise ValueError(f"{name} must be on the selection's device {device}, got {t.device}")
    table = plan.table[: N * H * W].view(N, H, W)
    can = kernels_can_run_on(device)
    if use_kernel and not can:
        raise ValueError(f"use_kernel=True but Triton kernels cannot run on device {device} (see `longsparse info`)")
    if not (can if use_kernel is None else use_kernel):
        ref_table, src, dst, ref_stats = plan_slot_copies_ref(selection, seqlens, seq_slots, resident, slot_map)
        table.copy_(ref_table)
        plan.src[: src.numel()] = src
        plan.dst[: dst.numel()] = dst
        plan.count.fill_(src.numel())
        stats += ref_stats
        return table
    if selection.stride(2) != 1:
        selection = selection.contiguous()
    plan.count.zero_()
    if N * H == 0:
        return table
    fast(load_kernels("plan", __package__).plan_fwd_kernel_slots)[(N * H,)](
        selection, seqlens, seq_slots, resident, table, plan.src, plan.dst, plan.count, stats,
        selection.stride(0), selection.stride(1), resident.stride(0),
        slot_map.host_seq_stride, slot_map.host_head_stride, slot_map.host_offset, slot_map.gpu_offset, W,
        HKV=H, WP=next_pow2(W), C=C, CP=next_pow2(max(C, 1)), BLOCK=slot_map.block_size,
        INIT=slot_map.init_blocks, LOCAL=slot_map.local_blocks,
        num_warps=4 if next_pow2(W) * next_pow2(max(C, 1)) <= 4096 else 8,
    )  # fmt: skip
    return table
