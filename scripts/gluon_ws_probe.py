"""Does Triton 3.6's Gluon build a warp-specialised Hopper loop of the shape the next SparseGDN walk needs? Compiles,
for sm_90a on a machine without a GPU, a small kernel: a one-warp producer partition brings ``[64, 128]`` tiles by
TMA into a two-stage ring (``ready`` / ``empty`` mbarriers), and the default partition (one warpgroup) chains a
state through ``warpgroup_mma`` over them (``S ← S + Xᵀ (X S)``, the walk's two dependent products per chunk),
releasing each stage as it is read. Reports registers, spills, shared memory, warps and the ``setmaxnreg`` the
build carries. Nothing here is launched; the kernel is a compile probe, not a kernel of the library.

Triton 3.6, 2026-12-01: it builds — 8 warps (the one-warp producer is padded to a warpgroup), 255 registers at entry
(168 with ``maxnreg``), 57,380 B of shared memory, ``setmaxnreg.inc 256`` for the default partition and ``.dec 40``
for the producer.

    PYTHONPATH=/work/venv36/lib/python3.11/site-packages:src python -P scripts/gluon_ws_probe.py
"""

from __future__ import annotations

import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.runtime.jit import mangle_type  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_report import TARGET, _ptxas_resources  # noqa: E402

ROWS, K, BV, STAGES = 64, 128, 64, 2


@gluon.jit
def _producer(x_desc, x_s, ready, empty, n):
    """One warp: tile ``i`` of ``x [n·64, 128]`` into stage ``i % 2`` once that stage is free."""
    for i in range(n):
        s = i % 2
        mbarrier.wait(empty.index(s), ((i // 2) & 1) ^ 1)  # the first pass over each stage does not wait
        mbarrier.expect(ready.index(s), x_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(x_desc, [i * 64, 0], ready.index(s), x_s.index(s))


@gluon.jit
def _consumer(x_s, s_s, ready, empty, out, n, BV: gl.constexpr):
    """One warpgroup: ``S ← S + Xᵀ (X S)`` per tile, the state in accumulator registers and its bf16 copy in
    ``s_s``; stores ``S`` at the end."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BV, 16])
    S = gl.zeros([128, BV], gl.float32, MMA)
    zero = gl.zeros([64, BV], gl.float32, MMA)
    xs_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, BV], gl.bfloat16)
    xs_s = gl.allocate_shared_memory(gl.bfloat16, [64, BV], xs_layout)
    for i in range(n):
        st = i % 2
        mbarrier.wait(ready.index(st), (i // 2) & 1)
        xs = warpgroup_mma(x_s.index(st), s_s, zero, use_acc=False, is_async=True)
        xs = warpgroup_mma_wait(0, deps=(xs,))
        xs_s.store(xs.to(gl.bfloat16))
        fence_async_shared()
        gl.thread_barrier()
        S = warpgroup_mma(x_s.index(st).permute((1, 0)), xs_s, S, is_async=True)
        S = warpgroup_mma_wait(0, deps=(S,))
        mbarrier.arrive(empty.index(st), count=1)
        gl.thread_barrier()
        s_s.store(S.to(gl.bfloat16))
        fence_async_shared()
        gl.thread_barrier()
    rows = gl.arange(0, 128, layout=gl.SliceLayout(1, MMA))
    cols = gl.arange(0, BV, layout=gl.SliceLayout(0, MMA))
    gl.store(out + rows[:, None] * BV + cols[None, :], S)


@gluon.jit
def ws_probe_kernel(x_desc, out, n, BV: gl.constexpr):
    x_s = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 128], x_desc.layout)
    s_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([128, BV], gl.bfloat16)
    s_s = gl.allocate_shared_memory(gl.bfloat16, [128, BV], s_layout)
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(2):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    s_s.store(gl.zeros([128, BV], gl.bfloat16, gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])))
    fence_async_shared()
    gl.warp_specialize(
        [(_consumer, (x_s, s_s, ready, empty, out, n, BV)), (_producer, (x_desc, x_s, ready, empty, n))],
        [1],
        [40],
    )


def main() -> int:
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    x = torch.zeros(ROWS, K, dtype=torch.bfloat16)
    desc = TensorDescriptor.from_tensor(x, [64, K], gl.NVMMASharedLayout.get_default_for([64, K], gl.bfloat16))
    signature = {"x_desc": mangle_type(desc), "out": "*fp32", "n": "i32", "BV": "constexpr"}
    src = GluonASTSource(ws_probe_kernel, signature, constexprs={"BV": BV}, attrs={(1,): [["tt.divisibility", 16]]})
    print(f"triton {triton.__version__}, target {TARGET}")
    try:
        compiled = triton.compile(src, target=TARGET, options={"num_warps": 4})
    except Exception as exc:
        print(f"FAILED {type(exc).__name__}: {str(exc)[:3000]}")
        return 1
    ptx = compiled.asm["ptx"]
    regs, spills = _ptxas_resources(ptx, compiled.metadata.name)
    setmaxnreg = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)
    wgmma = len(re.findall(r"wgmma\.mma_async", ptx))
    print(
        f"built: {regs} registers, {spills} B spilled, {compiled.metadata.shared} B shared memory, "
        f"{compiled.metadata.num_warps} warps, {wgmma} wgmma, setmaxnreg {sorted(set(setmaxnreg)) or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
