"""Qwen3.5-style hybrid decoder: Gated DeltaNet layers and gated full-attention layers in the order of
``layer_types``, zero-centred RMSNorms (``x̂ · (1 + w)``), partial RoPE.

Text-only positions are the same on Qwen3.5's three M-RoPE axes, so its interleaved M-RoPE reduces to plain RoPE over
the first ``partial_rotary_factor · head_dim`` channels, which is what runs here.
"""

from __future__ import annotations

import torch
from torch import nn

from ..distributed import TensorParallel
from .base import CausalLM, TextModel
from .batch import ForwardBatch
from .config import HybridConfig
from .layers import Attention, GatedDeltaNet, GatedMLP, RMSNorm
from .parallel import VocabParallelEmbedding
from .plan import StepPlan


class HybridDecoderLayer(nn.Module):
    """Pre-norm block whose token mixer is ``linear_attn`` (GDN) or ``self_attn`` (gated attention)."""

    def __init__(self, config: HybridConfig, layer_idx: int, parallel: TensorParallel | None = None):
        super().__init__()
        self.layer_type = config.layer_types[layer_idx]
        if self.layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(
                layer_idx,
                config.hidden_size,
                config.linear_num_key_heads,
                config.linear_num_value_heads,
                config.linear_key_head_dim,
                config.linear_value_head_dim,
                config.linear_conv_kernel_dim,
                config.rms_norm_eps,
                parallel=parallel,
            )
        else:
            self.self_attn = Attention(
                layer_idx,
                config.hidden_size,
                config.num_attention_heads,
                config.num_key_value_heads,
                config.head_dim,
                eps=config.rms_norm_eps,
                qkv_bias=config.attention_bias,
                o_bias=config.attention_bias,
                qk_norm="zero_centered",
                output_gate=True,
                parallel=parallel,
            )
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, parallel=parallel)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, zero_centered=True)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, zero_centered=True)

    @property
    def mixer(self) -> GatedDeltaNet | Attention:
        return self.linear_attn if self.layer_type == "linear_attention" else self.self_attn

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch, plan: StepPlan
    ) -> torch.Tensor:
        x = self.input_layernorm(h)
        if self.layer_type == "linear_attention":
            h = h + self.linear_attn(x, batch, plan)
        else:
            h = h + self.self_attn(x, cos, sin, batch, plan)
        return h + self.mlp(self.post_attention_layernorm(h))


class Qwen35ForCausalLM(CausalLM):
    """A :class:`HybridConfig` model with Hugging Face's text parameter names (``model.layers.{i}.linear_attn.A_log``,
    ``model.layers.{i}.self_attn.q_norm``, …); ``parallel``: the tensor-parallel rank it is built for."""

    def __init__(self, config: HybridConfig, parallel: TensorParallel | None = None):
        super().__init__()
        parallel = parallel or TensorParallel()
        self.model = TextModel(
            VocabParallelEmbedding(config.vocab_size, config.hidden_size, parallel=parallel),
            [HybridDecoderLayer(config, i, parallel) for i in range(config.num_hidden_layers)],
            RMSNorm(config.hidden_size, config.rms_norm_eps, zero_centered=True),
        )
        self._finish(config, parallel)
