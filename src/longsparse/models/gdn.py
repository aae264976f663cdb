"""GDN prefill cores: what a Gated DeltaNet layer calls for the gated delta rule over a prefill.

A core takes FLA-layout inputs ``q, k [1, T, H, K]`` (not yet L2-normalised), ``v [1, T, HV, V]``, ``g, beta
[1, T, HV]`` (natural-log decay; write strength in [0, 1], the layer's sigmoid), ``initial_state [N, HV, K, V]`` and
``cu_seqlens [N + 1]`` (sequences packed along T), plus the layer's pre-activation output gate ``z [1, T, HV, V]``
and gated-RMSNorm weight ``[V]`` (SparseGDN uses them to judge which recurrence events are visible at the output). It
returns the core output ``o [1, T, HV, V]`` (before the gated RMSNorm), the final state ``[N, HV, K, V]`` in float32
and the keep ratio as a 0-dim device tensor (``None`` for the dense core; the step reads its layers' ratios at once,
not with a host sync per layer). Scale is ``K ** -0.5``; q and k are L2-normalised inside (eps 1e-6), as Qwen3.5
requires.

Decode steps do not go through a core: one token is a single recurrence step, done in the layer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from ..ops._triton import kernels_can_run_on
from ..ops.gdn import naive_chunk_gated_delta_rule
from ..ops.gdn.heads import HeadSplit


class GDNCore(ABC):
    mode: str

    @abstractmethod
    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        *,
        initial_state: torch.Tensor | None,
        cu_seqlens: torch.Tensor | None,
        gate: torch.Tensor,
        gate_norm_weight: torch.Tensor,
        scratch: dict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``scratch``: the step's per-step dict (``ForwardBatch.scratch``), where a core may keep what every GDN
        layer of the step can share."""


DENSE_KERNELS = ("auto", "fla", "torch")
PLAN_KEY = "sparse_gdn_launch_plan"
"""Where the step's scratch keeps the SparseGDN launch plan its GDN layers share."""


class DenseGDN(GDNCore):
    """The dense chunked gated delta rule.

    ``kernel``: ``"fla"`` runs FLA's Triton ``chunk_gated_delta_rule`` (same arguments and semantics; needs the
    optional ``fla`` package and a CUDA tensor), ``"torch"`` the reference ``naive_chunk_gated_delta_rule`` (any device,
    slow), ``"auto"`` (default) FLA for 16-bit inputs where it can run, else the reference. Float32 inputs get the
    reference under ``"auto"``: FLA's forward kernels take tf32 products for them (``tl.dot``'s default and its
    ``SOLVE_TRIL_DOT_PRECISION``), about 1e-3 relative, where a float32 model is asked for float32 accuracy;
    ``"fla"`` still runs FLA on them. :attr:`last_kernel` names the one that ran.
    """

    mode = "dense"

    def __init__(self, kernel: str = "auto"):
        if kernel not in DENSE_KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(DENSE_KERNELS)}, got {kernel!r}")
        self.kernel = kernel
        self.last_kernel: str | None = None

    def _fla(self, device: torch.device, dtype: torch.dtype):
        """FLA's ``chunk_gated_delta_rule`` if this call may and can use it, else None."""
        if self.kernel == "torch" or (self.kernel == "auto" and (device.type != "cuda" or dtype == torch.float32)):
            return None
        if device.type != "cuda":
            raise ValueError(f"kernel='fla' needs CUDA tensors, got {device}")
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        except ImportError:
            if self.kernel == "fla":
                raise ImportError("kernel='fla' needs the optional package fla (pip install fla-core)") from None
            return None
        return chunk_gated_delta_rule

    def __call__(self, q, k, v, g, beta, *, initial_state, cu_seqlens, gate, gate_norm_weight, scratch=None):
        fla = self._fla(q.device, q.dtype)
        run = fla or naive_chunk_gated_delta_rule
        o, state = run(
            q,
            k,
            v,
            g,
            beta,
            initial_state=initial_state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu_seqlens,
        )
        self.last_kernel = "fla" if fla is not None else "torch"
        return o, state.float(), None


class SparseGDN(GDNCore):
    """SparseGDN prefill (``longsparse.ops.gdn.sparse_chunk_gated_delta_rule``); ``config`` is passed through to it,
    and so is ``head_split`` (under tensor parallelism: the layer's heads this rank holds, so that the selection is
    the one every head would get in one process)."""

    mode = "sparse"

    def __init__(self, config: Any = None, head_split: HeadSplit | None = None):
        self.config = config
        self.head_split = head_split

    def __call__(self, q, k, v, g, beta, *, initial_state, cu_seqlens, gate, gate_norm_weight, scratch=None):
        from ..ops.gdn import sparse_chunk_gated_delta_rule

        o, state, stats = sparse_chunk_gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            initial_state=initial_state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu_seqlens,
            gate=gate,
            gate_norm_weight=gate_norm_weight,
            config=self.config,
            return_stats=True,
            plan=self._shared_plan(scratch, q, cu_seqlens),
            bounded_inputs=True,  # the layer's β is a sigmoid and the op normalises the keys itself
            head_split=self.head_split,
        )
        return o, state.float(), stats.keep_ratio_device

    def _shared_plan(self, scratch: dict | None, q: torch.Tensor, cu_seqlens: torch.Tensor | None):
        """The launch plan every SparseGDN layer of the step shares: the first builds it into ``scratch``, the others
        reuse it (None where the GPU kernels will not run)."""
        backend = getattr(self.config, "backend", "auto")
        if scratch is None or backend == "torch" or not q.is_cuda or not kernels_can_run_on(q.device):
            return None
        from ..ops.gdn.launch import plan_for

        if PLAN_KEY not in scratch:
            scratch[PLAN_KEY] = plan_for(q.shape[0], q.shape[1], cu_seqlens, q.device)
        return scratch[PLAN_KEY]


def make_gdn_core(mode: str, sparse_config: Any = None, head_split: HeadSplit | None = None) -> GDNCore:
    if mode == "dense":
        return DenseGDN()
    if mode == "sparse":
        return SparseGDN(sparse_config, head_split)
    raise ValueError(f"gdn mode must be one of dense, sparse, got {mode!r}")
