"""Triton kernel of the copy planner (launched from ``transfer.plan``): one program per (sequence, KV head) row.

The row's selection (``WP`` entries) is compared with its resident dynamic slots (``CP``) as a ``[WP, CP]`` match
matrix; hits, free slots and the rank-to-rank assignment of misses to free slots follow from row/column reductions
and prefix sums, exactly as ``naive.plan_slot_copies_ref`` states them. A row reserves its place in the flat task
list with one atomic add, so tasks of different rows land in launch order, each row's own in list order.
"""

import triton
import triton.language as tl


@triton.jit
def plan_fwd_kernel_slots(
    sel_ptr,
    len_ptr,
    seq_ptr,
    res_ptr,
    tbl_ptr,
    src_ptr,
    dst_ptr,
    cnt_ptr,
    stats_ptr,
    stride_sb,
    stride_sh,
    stride_rr,
    host_seq_stride,
    host_head_stride,
    host_offset,
    gpu_offset,
    W,
    HKV: tl.constexpr,
    WP: tl.constexpr,
    C: tl.constexpr,
    CP: tl.constexpr,
    BLOCK: tl.constexpr,
    INIT: tl.constexpr,
    LOCAL: tl.constexpr,
):
    i_bh = tl.program_id(0)
    i_b, i_h = i_bh // HKV, i_bh % HKV
    o_w = tl.arange(0, WP)
    o_c = tl.arange(0, CP)
    m_w = o_w < W
    m_c = o_c < C
    sel = tl.load(sel_ptr + i_b.to(tl.int64) * stride_sb + i_h * stride_sh + o_w, mask=m_w, other=-1).to(tl.int32)
    seqlen = tl.load(len_ptr + i_b).to(tl.int32)
    seq = tl.load(seq_ptr + i_b).to(tl.int64)
    row = seq * HKV + i_h
    res = tl.load(res_ptr + row * stride_rr + o_c, mask=m_c, other=-1)

    qb = (seqlen - 1) // BLOCK
    valid = sel >= 0
    forced = valid & ((sel < INIT) | (sel >= qb - LOCAL))
    dyn = valid & (forced == 0)
    eq = dyn[:, None] & (sel[:, None] == res[None, :]) & (res[None, :] >= 0)
    eq_i = eq.to(tl.int32)
    hit = tl.max(eq_i, axis=1) > 0
    hit_slot = tl.max(tl.where(eq, o_c[None, :], -1), axis=1)
    keep = tl.max(eq_i, axis=0) > 0
    miss = dyn & (hit == 0)
    free = m_c & (keep == 0)
    miss_i = miss.to(tl.int32)
    free_i = free.to(tl.int32)
    miss_rank = tl.cumsum(miss_i, axis=0) - miss_i
    free_rank = tl.cumsum(free_i, axis=0) - free_i
    assign = miss[:, None] & free[None, :] & (miss_rank[:, None] == free_rank[None, :])
    miss_slot = tl.max(tl.where(assign, o_c[None, :], -1), axis=1)
    copied = miss & (miss_slot >= 0)

    FORCED: tl.constexpr = INIT + LOCAL + 1
    base = row * (FORCED + C)
    ring = INIT + sel % (LOCAL + 1)
    forced_slot = tl.where(sel < INIT, sel, ring)
    dyn_slot = tl.where(hit, hit_slot, miss_slot)
    slot = tl.where(forced, forced_slot, tl.where(dyn & (dyn_slot >= 0), FORCED + dyn_slot, -1))
    table = tl.where(slot >= 0, base + slot, -1)
    tl.store(tbl_ptr + i_bh.to(tl.int64) * W + o_w, table.to(tl.int32), mask=m_w)

    taken = tl.max(assign.to(tl.int32), axis=0) > 0
    new_block = tl.max(tl.where(assign, sel[:, None], -1), axis=0)
    tl.store(res_ptr + row * stride_rr + o_c, tl.where(taken, new_block, res), mask=m_c)

    n_copy = tl.sum(copied.to(tl.int32), axis=0)
    start = tl.atomic_add(cnt_ptr, n_copy)
    task = (start + miss_rank).to(tl.int64)
    host_row = seq * host_seq_stride + i_h * host_head_stride + host_offset + sel.to(tl.int64)
    gpu_row = gpu_offset + base + FORCED + miss_slot.to(tl.int64)
    tl.store(src_ptr + task, host_row, mask=copied)
    tl.store(dst_ptr + task, gpu_row, mask=copied)

    n_dyn = tl.sum(dyn.to(tl.int32), axis=0)
    n_miss = tl.sum(miss_i, axis=0)
    tl.atomic_add(stats_ptr + 0, n_dyn.to(tl.int64))
    tl.atomic_add(stats_ptr + 1, (n_dyn - n_miss).to(tl.int64))
    tl.atomic_add(stats_ptr + 2, n_copy.to(tl.int64))
    tl.atomic_add(stats_ptr + 3, (n_miss - n_copy).to(tl.int64))
