"""SparseGDN (Zhuang et al., arXiv:2610.41420), Sec. 2: sparse gated-delta-rule prefill with FLA's
``chunk_gated_delta_rule`` arguments.

Two backends compute the same operator: ``"torch"`` runs the executable specification (``spec/``) on any device;
``"triton"`` runs the GPU kernels (``launch.py``: intra → selection → fused main pass). ``"auto"`` takes the kernels
whenever they support the call.
"""

from __future__ import annotations

import torch

from .checks import check_gate_inputs, check_gdn_inputs
from .config import SparseGDNConfig, SparseGDNKernelConfig
from .heads import HeadSplit
from .naive import compute_dtype, prepare_inputs
from .spec.pipeline import run_spec
from .stats import SparseGDNStats


def _kernel_backend(q, v, config, kernel_config):
    """The Triton path, or None with the reason it does not apply (so "auto" can fall back to torch).

    "auto" takes the kernels only compiled on a GPU; Triton's CPU interpreter runs them only when asked for by name.
    """
    from ..._optional import available

    if not available("triton"):
        return None, "triton is not installed (pip install 'longsparse[gpu]')"
    from .._triton import COMPILED, triton_mode
    from . import launch

    if kernel_config.backend == "auto" and not (q.is_cuda and triton_mode() == COMPILED):
        return None, "not on a GPU with compiled Triton kernels"
    reason = launch.supports(q, v, config)
    return (None, reason) if reason else (launch.sparse_gdn_triton_forward, None)


def sparse_chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    *,
    gate: torch.Tensor | None = None,
    gate_norm_weight: torch.Tensor | None = None,
    config: SparseGDNConfig | None = None,
    kernel_config: SparseGDNKernelConfig | None = None,
    return_stats: bool = False,
    plan=None,
    bounded_inputs: bool = False,
    head_split: HeadSplit | None = None,
):
    """SparseGDN prefill: the gated delta rule with a block-adjacent local solve, selected recurrent events and the
    two-chunk grouped output (the paper's approximate operator; ``solve="full", selection="all"`` is exact).

    Args:
        q, k: ``[B, T, H, K]``. v: ``[B, T, HV, V]``; the HV / H value heads of qk head j form pair j, which shares one
            event mask. g: ``[B, T, HV]`` natural-log per-token decay. beta: ``[B, T, HV]``.
        scale: output scale, default ``K ** -0.5`` (the paper's 1/√d).
        initial_state: ``[N, HV, K, V]``, the state before each sequence. output_final_state: return S_C.
        use_qk_l2norm_in_kernel: L2-normalise q and k first. cu_seqlens: ``[N + 1]`` packed sequences (B == 1).
        gate: ``[B, T, HV, V]`` the pre-activation output gate z; gate_norm_weight: ``[V]`` the gated RMSNorm's
            effective weight (ones if None). They only feed the selector's visibility factor G_h (1 without gate);
            the output is the GDN core output, before norm and gate.
        config: :class:`SparseGDNConfig`, what is computed (default: the paper's defaults).
        kernel_config: :class:`SparseGDNKernelConfig`, how it runs: the backend, the kernels' forms and launch
            settings (default: its defaults).
        return_stats: also return a :class:`SparseGDNStats`.
        plan: a :class:`~longsparse.ops.gdn.launch.LaunchPlan` of these sequences
            (:func:`~longsparse.ops.gdn.launch.plan_launch`), shared by calls over the same sequences — a model's
            GDN layers in one forward pass — so the GPU path's host planning and its small copies run once; the
            torch backend does not use it.
        bounded_inputs: the caller's promise that ``|β| <= 1`` everywhere (β = sigmoid(b), as in Qwen3.5's GDN
            layers) and that the keys have unit norm (``|k|² <= 1.03``; ``use_qk_l2norm_in_kernel`` guarantees this
            half). The GPU path's intra solve then takes fp16 products for every chunk without testing each
            chunk's range first (H200: 8 % of intra, ~3 % of the op at 128K). Nothing else changes, and on such
            inputs the output is bit-equal to the tested form's. A broken promise can overflow fp16: the output
            then holds inf or NaN, not finite wrong values. The torch backend does not use it.
        head_split: the call holds these value heads of a layer whose other heads other calls (tensor-parallel
            ranks) hold at the same time (:class:`~longsparse.ops.gdn.heads.HeadSplit`): the selection is taken over
            every head, exchanging a few numbers per head, so that the output is this call's heads' part of one
            call over all of them; the stats are then the whole layer's.

    Returns:
        ``(o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] or None)`` and, with ``return_stats``, the stats
        as a third element. The final state is in the compute dtype (float64 for float64 inputs, else float32).
    """
    offsets = plan.offsets_of(cu_seqlens) if plan is not None else None  # no device read per layer
    problem = check_gdn_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens, offsets)
    check_gate_inputs(problem, v, gate, gate_norm_weight)
    if config is None:
        config = SparseGDNConfig()
    elif not isinstance(config, SparseGDNConfig):
        raise ValueError(f"config must be a SparseGDNConfig, got {type(config).__name__}")
    if kernel_config is None:
        kernel_config = SparseGDNKernelConfig()
    elif not isinstance(kernel_config, SparseGDNKernelConfig):
        raise ValueError(f"kernel_config must be a SparseGDNKernelConfig, got {type(kernel_config).__name__}")
    if not isinstance(bounded_inputs, bool):
        raise ValueError(f"bounded_inputs must be a bool, got {type(bounded_inputs).__name__}")
    if head_split is not None:
        head_split.check(problem.HV, problem.group)
    backend = kernel_config.backend
    kernels, why_not = (None, "backend='torch'") if backend == "torch" else _kernel_backend(q, v, config, kernel_config)
    if backend == "triton" and kernels is None:
        raise ValueError(f"SparseGDN backend='triton' cannot run this call: {why_not}")
    if kernels is not None:
        if plan is None and cu_seqlens is not None:  # the kept plan of these offsets, found by the checks' host copy
            from .launch import plan_for

            plan = plan_for(problem.B, problem.T, cu_seqlens, q.device, problem.offsets)
        return kernels(
            q,
            k,
            v,
            g,
            beta,
            scale,
            initial_state,
            output_final_state,
            use_qk_l2norm_in_kernel,
            cu_seqlens,
            gate=gate,
            gate_norm_weight=gate_norm_weight,
            config=config,
            kernel_config=kernel_config,
            return_stats=return_stats,
            plan=plan,
            bounded_inputs=bounded_inputs,
            head_split=head_split,
        )
    scale = problem.K**-0.5 if scale is None else scale
    dtype = compute_dtype(q.dtype)
    qe, ke, v, g, beta = prepare_inputs(q, k, v, g, beta, dtype, use_qk_l2norm_in_kernel)
    trace = run_spec(
        qe,
        ke,
        v,
        g,
        beta,
        group=problem.group,
        scale=scale,
        config=config,
        initial_state=None if initial_state is None else initial_state.to(dtype),
        cu_seqlens=cu_seqlens,
        gate=gate,
        gate_norm_weight=gate_norm_weight,
        heads=head_split,
    )
    o = trace.o.to(q.dtype)
    final_state = trace.recurrence.final_state if output_final_state else None
    if return_stats:
        return o, final_state, SparseGDNStats.from_selection(trace.selection, trace.layout, trace.events.num_snapshots)
    return o, final_state
