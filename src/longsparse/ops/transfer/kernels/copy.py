"""Persistent Triton kernel that copies rows by index lists (launched from ``transfer.copy``).

``NCTA`` programs stay resident for the whole copy: program ``p`` takes tasks ``p, p + NCTA, ...`` up to the task
count, which it reads from device memory (the planner writes it; the host never needs it). A task moves one row of
``ROW`` 32-bit words in chunks of ``CHUNK``: with the source in pinned host memory the loads are PCIe reads through
unified virtual addressing, issued for a whole chunk before any store, so each program keeps a chunk in flight.
"""

import triton
import triton.language as tl


@triton.jit
def copy_fwd_kernel_rows(
    src_ptr,
    dst_ptr,
    src_rows_ptr,
    dst_rows_ptr,
    cnt_ptr,
    ROW: tl.constexpr,
    CHUNK: tl.constexpr,
    NCTA: tl.constexpr,
):
    pid = tl.program_id(0)
    n = tl.load(cnt_ptr)
    o = tl.arange(0, CHUNK)
    t = pid
    while t < n:
        s = tl.load(src_rows_ptr + t).to(tl.int64) * ROW
        d = tl.load(dst_rows_ptr + t).to(tl.int64) * ROW
        for c in range(0, ROW, CHUNK):
            m = c + o < ROW
            x = tl.load(src_ptr + s + c + o, mask=m)
            tl.store(dst_ptr + d + c + o, x, mask=m)
        t += NCTA
