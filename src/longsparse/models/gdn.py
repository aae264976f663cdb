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
from typing import TYPE_CHECKING, Any

import torch

from ..ops._triton import kernels_can_run_on
from ..ops.gdn import naive_chunk_gated_delta_rule
from ..ops.gdn.heads import HeadSplit

if TYPE_CHECKING:
    from ..ops.gdn.launch import LaunchPlan


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
        launch_plan: LaunchPlan | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``launch_plan``: the step's SparseGDN launch plan (:attr:`StepPlan.gdn_launch
        <longsparse.models.plan.StepPlan.gdn_launch>`), shared by every GDN layer of the step."""

    def plans_launch(self, device: torch.device) -> bool:
        """Whether this core's calls on ``device`` run the GPU kernels that share a step's launch plan."""
        return False


DENSE_KERNELS = ("auto", "fla", "torch")


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

    def __call__(self, q, k, v, g, beta, *, initial_state, cu_seqlens, gate, gate_norm_weight, launch_plan=None):
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
    """SparseGDN prefill (``longsparse.ops.gdn.sparse_chunk_gated_delta_rule``); ``config`` and ``kernel_config`` are
    passed through to it, and so is ``head_split`` (under tensor parallelism: the layer's heads this rank holds, so
    that the selection is the one every head would get in one process)."""

    mode = "sparse"

    def __init__(self, config: Any = None, kernel_config: Any = None, head_split: HeadSplit | None = None):
        self.config = config
        self.kernel_config = kernel_config
        self.head_split = head_split

    def __call__(self, q, k, v, g, beta, *, initial_state, cu_seqlens, gate, gate_norm_weight, launch_plan=None):
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
            kernel_config=self.kernel_config,
            return_stats=True,
            plan=launch_plan if self.plans_launch(q.device) else None,
            bounded_inputs=True,  # the layer's β is a sigmoid and the op normalises the keys itself
            head_split=self.head_split,
        )
        return o, state.float(), stats.keep_ratio_device

    def plans_launch(self, device):
        backend = getattr(self.kernel_config, "backend", "auto")
        return backend != "torch" and device.type == "cuda" and kernels_can_run_on(device)


def make_gdn_core(
    mode: str, sparse_config: Any = None, kernel_config: Any = None, head_split: HeadSplit | None = None
) -> GDNCore:
    if mode == "dense":
        return DenseGDN()
    if mode == "sparse":
        return SparseGDN(sparse_config, kernel_config, head_split)
    raise ValueError(f"gdn mode must be one of dense, sparse, got {mode!r}")
