"""Building blocks of the decoders: norms, rotary embeddings, the gated MLP, attention and the Gated DeltaNet layer.

Parameter names follow Hugging Face's (``q_proj``, ``in_proj_qkv``, ``A_log``, …) so checkpoints load without
renaming. Activations are packed ``[T, hidden]`` (see :mod:`longsparse.models.batch`). Norms, RoPE, the GDN gates
and the GDN state compute in float32 whatever the weights' dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import TensorParallel
from ..ops._triton import resolve_use_kernel
from ..ops.conv import causal_conv1d
from ..ops.gdn.naive import l2norm
from ..ops.norm import gated_rms_norm, rms_norm
from .attention import AttentionBackend, DenseAttention
from .batch import ForwardBatch
from .config import RopeConfig
from .gdn import DenseGDN, GDNCore
from .parallel import ColumnParallelLinear, RowParallelLinear, Shard
from .plan import StepPlan


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x²) + eps)`` over the last dim, times the weight.

    ``zero_centered``: the stored weight is ``w − 1`` and the result is ``x̂ · (1 + w)`` in float32 (Qwen3.5);
    otherwise ``w · x̂`` with ``x̂`` cast back to the input dtype first (Llama).
    """

    def __init__(self, dim: int, eps: float, zero_centered: bool = False):
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # one Triton pass on a GPU (the torch form makes several passes over a float32 copy of x)
        use_kernel = resolve_use_kernel(None, x.device)
        return rms_norm(x, self.weight, self.eps, zero_centered=self.zero_centered, use_kernel=use_kernel)


class GatedRMSNorm(nn.Module):
    """GDN output norm: ``w · x̂ · silu(z)`` per head over the head dim (``x, z [..., V]``)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        # one Triton pass on a GPU (the torch form makes ~10 passes over float32 copies of [T, HV, V])
        return gated_rms_norm(x, z, self.weight, self.eps, use_kernel=resolve_use_kernel(None, x.device))


def rope_inv_freq(rope: RopeConfig) -> torch.Tensor:
    """``[rotary_dim / 2]`` float64 angular frequency of each rotated channel pair, after the rope type's scaling.

    Always on the CPU (also when a model is built under ``torch.device("meta")``)."""
    dim = rope.rotary_dim
    inv = 1.0 / rope.theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim)
    if rope.rope_type == "linear":
        return inv / rope.factor
    if rope.rope_type == "llama3":
        original = rope.original_max_position_embeddings
        wavelen = 2 * math.pi / inv
        low_wavelen = original / rope.low_freq_factor
        high_wavelen = original / rope.high_freq_factor
        smooth = (original / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        blended = (1 - smooth) * inv / rope.factor + smooth * inv
        scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
        return torch.where((wavelen >= high_wavelen) & (wavelen <= low_wavelen), blended, scaled)
    if rope.rope_type == "longrope":
        factors = rope.long_factor if rope.uses_long_factors else rope.short_factor
        return inv / torch.tensor(factors, dtype=torch.float64, device="cpu")
    return inv


class RotaryEmbedding:
    """cos/sin tables for given positions: ``[T, rotary_dim]`` float32 each (rotate-half layout), times
    LongRoPE's attention scale. Angles are formed in float64 so that positions near 128K keep their precision."""

    def __init__(self, rope: RopeConfig):
        self.rope = rope
        self.inv_freq = rope_inv_freq(rope)
        self.scale = rope.attention_scale
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv = self._on_device.get(positions.device)
        if inv is None:
            inv = self._on_device[positions.device] = self.inv_freq.to(positions.device)
        angles = positions.to(torch.float64)[:, None] * inv[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        return (angles.cos() * self.scale).float(), (angles.sin() * self.scale).float()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` channels of ``x [T, heads, D]`` (rotate-half), in float32."""
    rd = cos.shape[-1]
    xf = x.float()
    rot = xf[..., :rd]
    half = rd // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    out = rot * cos[:, None, :] + rotated * sin[:, None, :]
    if rd < x.shape[-1]:
        out = torch.cat([out, xf[..., rd:]], dim=-1)
    return out.to(x.dtype)


class GatedMLP(nn.Module):
    """``down(silu(gate(x)) · up(x))``; under tensor parallelism gate and up hold this rank's intermediate channels
    and down sums the ranks' parts (one all-reduce)."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, bias: bool = False, *, parallel: TensorParallel | None = None
    ):
        super().__init__()
        parallel = parallel or TensorParallel()
        channels = parallel.partition(intermediate_size, "intermediate_size")
        rows = Shard.blocks(channels, 1, intermediate_size)
        self.gate_proj = ColumnParallelLinear(hidden_size, rows, bias=bias)
        self.up_proj = ColumnParallelLinear(hidden_size, rows, bias=bias)
        self.down_proj = RowParallelLinear(
            Shard.blocks(channels, 1, intermediate_size, dim=1), hidden_size, bias=bias, parallel=parallel
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Grouped-query causal self-attention of layer ``layer_idx``.

    ``qk_norm``: ``None``, ``"plain"`` (Qwen3) or ``"zero_centered"`` (Qwen3.5) RMSNorm over the head dim of q and k
    before RoPE. ``output_gate`` (Qwen3.5): ``q_proj`` emits, per head, the query and then a gate; the attention output
    is multiplied by ``sigmoid(gate)`` before ``o_proj``. ``backend`` does the attention itself (dense SDPA by default;
    the model sets the mode chosen at load time). ``forecasters`` run on the layer's input ``x`` before it attends
    (SparDA's Forecast of the next attention layer's blocks, handed on through the step's plan; set by the model with
    the modes).

    ``num_heads`` and ``num_kv_heads`` are the model's; under tensor parallelism (``parallel``) the layer holds this
    rank's query heads and the KV heads they read (:meth:`TensorParallel.partition_replicated`), and ``o_proj`` sums
    the ranks' parts. ``self.num_heads`` / ``self.num_kv_heads`` are the heads the layer holds.
    """

    def __init__(
        self,
        layer_idx: int,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        eps: float,
        qkv_bias: bool = False,
        o_bias: bool = False,
        qk_norm: str | None = None,
        output_gate: bool = False,
        parallel: TensorParallel | None = None,
    ):
        super().__init__()
        parallel = parallel or TensorParallel()
        heads = parallel.partition(num_heads, "num_attention_heads")
        kv_heads = parallel.partition_replicated(num_kv_heads, "num_key_value_heads")
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = len(heads), len(kv_heads), head_dim
        self.output_gate = output_gate
        # an output-gated q_proj emits each head's query and gate rows together: its heads are 2 · head_dim wide
        q_rows = Shard.blocks(heads, head_dim * (2 if output_gate else 1), num_heads)
        kv_rows = Shard.blocks(kv_heads, head_dim, num_kv_heads)
        self.q_proj = ColumnParallelLinear(hidden_size, q_rows, bias=qkv_bias)
        self.k_proj = ColumnParallelLinear(hidden_size, kv_rows, bias=qkv_bias)
        self.v_proj = ColumnParallelLinear(hidden_size, kv_rows, bias=qkv_bias)
        o_columns = Shard.blocks(heads, head_dim, num_heads, dim=1)
        self.o_proj = RowParallelLinear(o_columns, hidden_size, bias=o_bias, parallel=parallel)
        if qk_norm is not None:
            zero_centered = {"plain": False, "zero_centered": True}[qk_norm]
            self.q_norm = RMSNorm(head_dim, eps, zero_centered)
            self.k_norm = RMSNorm(head_dim, eps, zero_centered)
        else:
            self.q_norm = self.k_norm = None
        self.backend: AttentionBackend = DenseAttention()
        self.forecasters: list[Callable[[torch.Tensor, torch.Tensor, torch.Tensor, ForwardBatch, StepPlan], None]] = []

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch, plan: StepPlan
    ) -> torch.Tensor:
        T = x.shape[0]
        H, D = self.num_heads, self.head_dim
        q = self.q_proj(x)
        gate = None
        if self.output_gate:
            q, gate = q.view(T, H, 2 * D).chunk(2, dim=-1)
            gate = gate.reshape(T, H * D)
        else:
            q = q.view(T, H, D)
        k = self.k_proj(x).view(T, self.num_kv_heads, D)
        v = self.v_proj(x).view(T, self.num_kv_heads, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if batch.attention_observer is not None:
            batch.attention_observer(self.layer_idx, x, q, k)
        for forecast in self.forecasters:
            forecast(x, cos, sin, batch, plan)
        o = self.backend(self.layer_idx, q, k, v, batch, plan).reshape(T, H * D)
        if gate is not None:
            o = o * torch.sigmoid(gate)
        return self.o_proj(o)


class GatedDeltaNet(nn.Module):
    """Qwen3.5's Gated DeltaNet layer (``linear_attn``).

    ``x → in_proj_qkv → causal depthwise conv (kernel K, per sequence, with a conv state of the last K − 1 inputs) →
    silu → q, k [H, Dk], v [HV, Dv]``; ``beta = sigmoid(in_proj_b x)``, ``g = −exp(A_log) · softplus(in_proj_a x +
    dt_bias)``; the gated delta rule (q, k L2-normalised, scale ``Dk ** -0.5``) gives ``o``; then
    ``out_proj(GatedRMSNorm(o, z = in_proj_z x))``. A prefill goes through ``core`` (dense or SparseGDN); a decode step
    is one recurrence step per sequence on the cached state. ``plan``: the step's (None: a step of this layer alone).

    The head counts are the model's; under tensor parallelism (``parallel``) the layer holds this rank's q/k heads and
    the v heads that read them — their rows of every projection, their channels of the conv (q, k and v alike), their
    gates and decays — and ``out_proj`` sums the ranks' parts. ``self.num_k_heads`` etc. are what the layer holds.
    """

    def __init__(
        self,
        layer_idx: int,
        hidden_size: int,
        num_k_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        conv_kernel: int,
        eps: float,
        parallel: TensorParallel | None = None,
    ):
        super().__init__()
        parallel = parallel or TensorParallel()
        k_heads = parallel.partition(num_k_heads, "linear_num_key_heads")
        v_heads = parallel.partition(num_v_heads, "linear_num_value_heads")
        self.layer_idx = layer_idx
        self.num_k_heads, self.num_v_heads = len(k_heads), len(v_heads)
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.key_dim, self.value_dim = self.num_k_heads * head_k_dim, self.num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_kernel = conv_kernel
        # the checkpoint's conv channels (and in_proj_qkv rows) are all q heads, all k heads, then all v heads
        full_key = num_k_heads * head_k_dim
        qk_start, qk_stop = k_heads.start * head_k_dim, k_heads.stop * head_k_dim
        v_start, v_stop = 2 * full_key + v_heads.start * head_v_dim, 2 * full_key + v_heads.stop * head_v_dim
        ranges = ((qk_start, qk_stop), (full_key + qk_start, full_key + qk_stop), (v_start, v_stop))
        channels = Shard(0, 2 * full_key + num_v_heads * head_v_dim, ranges, self.conv_dim)
        per_v_head = Shard.blocks(v_heads, 1, num_v_heads)
        self.in_proj_qkv = ColumnParallelLinear(hidden_size, channels)
        self.in_proj_z = ColumnParallelLinear(hidden_size, Shard.blocks(v_heads, head_v_dim, num_v_heads))
        self.in_proj_b = ColumnParallelLinear(hidden_size, per_v_head)
        self.in_proj_a = ColumnParallelLinear(hidden_size, per_v_head)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv_kernel, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(head_v_dim, eps)
        out_columns = Shard.blocks(v_heads, head_v_dim, num_v_heads, dim=1)
        self.out_proj = RowParallelLinear(out_columns, hidden_size, parallel=parallel)
        self.checkpoint_shards = {"conv1d.weight": channels, "dt_bias": per_v_head, "A_log": per_v_head}
        self.core: GDNCore = DenseGDN()

    def forward(self, x: torch.Tensor, batch: ForwardBatch, plan: StepPlan | None = None) -> torch.Tensor:
        T = x.shape[0]
        mixed = self.in_proj_qkv(x)
        z = self.in_proj_z(x).view(T, self.num_v_heads, self.head_v_dim)
        beta = torch.sigmoid(self.in_proj_b(x))
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float())
        mixed = self._conv_step(mixed, batch) if batch.is_decode else self._conv_prefill(mixed, batch)
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(T, self.num_k_heads, self.head_k_dim)
        k = k.reshape(T, self.num_k_heads, self.head_k_dim)
        v = v.reshape(T, self.num_v_heads, self.head_v_dim)
        if batch.is_decode:
            o = self._recurrent_step(q, k, v, g, beta, batch)
        else:
            o = self._prefill_core(q, k, v, g, beta, z, batch, plan if plan is not None else StepPlan())
        o = self.norm(o, z).reshape(T, self.value_dim)
        return self.out_proj(o)

    def _conv_prefill(self, mixed: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """Causal depthwise conv + silu of each sequence's ``[T_n, C]`` inputs, after its conv state (a Triton kernel
        over the packed ``[T, C]`` activations on a GPU: no transposes, one pass)."""
        states = batch.gdn_states
        conv = states.conv[self.layer_idx] if states is not None else None
        out, final = causal_conv1d(
            mixed,
            self.conv1d.weight[:, 0, :],
            batch.offsets,
            conv[batch.slot_index] if conv is not None else None,
            use_kernel=resolve_use_kernel(None, mixed.device),
            cu_seqlens=batch.cu_seqlens,
        )
        if conv is not None:
            conv[batch.slot_index] = final.to(conv.dtype)
        return out

    def _conv_step(self, mixed: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """One conv step for each of the N sequences: ``mixed [N, C]`` is their newest input."""
        conv = batch.gdn_states.conv[self.layer_idx]
        window = torch.cat([conv[batch.slot_index].to(mixed.dtype), mixed[:, :, None]], dim=-1)
        conv[batch.slot_index] = window[:, :, 1:].to(conv.dtype)
        return F.silu((window * self.conv1d.weight[:, 0, :]).sum(-1))

    def _prefill_core(self, q, k, v, g, beta, z, batch: ForwardBatch, plan: StepPlan) -> torch.Tensor:
        states = batch.gdn_states
        h0 = states.recurrent[self.layer_idx][batch.slot_index] if states is not None else None
        cu_seqlens = batch.cu_seqlens if batch.num_seqs > 1 else None
        o, final, keep = self.core(
            q[None],
            k[None],
            v[None],
            g[None],
            beta[None],
            initial_state=h0,
            cu_seqlens=cu_seqlens,
            gate=z[None],
            gate_norm_weight=self.norm.weight,
            launch_plan=plan.gdn_launch,
        )
        if states is not None:
            states.recurrent[self.layer_idx][batch.slot_index] = final
        if keep is not None:
            plan.stats.gdn_keep_ratios.append(keep)
        return o[0]

    def _recurrent_step(self, q, k, v, g, beta, batch: ForwardBatch) -> torch.Tensor:
        """One token per sequence: ``S ← e^g S``, ``u = β (v − Sᵀk)``, ``S ← S + k uᵀ``, ``o = Dk^-½ Sᵀq``."""
        rec = batch.gdn_states.recurrent[self.layer_idx]
        group = self.num_v_heads // self.num_k_heads
        q = l2norm(q.float()).repeat_interleave(group, dim=1)
        k = l2norm(k.float()).repeat_interleave(group, dim=1)
        S = rec[batch.slot_index] * g.exp()[:, :, None, None]
        u = beta.float()[:, :, None] * (v.float() - torch.einsum("nhk,nhkv->nhv", k, S))
        S = S + k[:, :, :, None] * u[:, :, None, :]
        rec[batch.slot_index] = S
        o = torch.einsum("nhk,nhkv->nhv", q, S) * self.head_k_dim**-0.5
        return o.to(v.dtype)
