"""Llama-family dense decoders: Llama, SmolLM2, Qwen2 (q/k/v biases), Qwen3 (q/k RMSNorm) and MiniCPM4
(``scale_emb`` on the embeddings, ``scale_depth / sqrt(num_layers)`` on every residual branch, final hidden states
divided by ``hidden_size / dim_model_base`` before the LM head, LongRoPE)."""

from __future__ import annotations

import torch
from torch import nn

from ..distributed import TensorParallel
from .base import CausalLM, TextModel
from .batch import ForwardBatch
from .config import DecoderConfig
from .layers import Attention, GatedMLP, RMSNorm
from .parallel import VocabParallelEmbedding
from .plan import StepPlan


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: ``h += s · attn(norm(h))``; ``h += s · mlp(norm(h))`` with ``s`` the residual scale."""

    def __init__(self, config: DecoderConfig, layer_idx: int, parallel: TensorParallel | None = None):
        super().__init__()
        self.residual_scale = config.residual_scale
        self.self_attn = Attention(
            layer_idx,
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            eps=config.rms_norm_eps,
            qkv_bias=config.qkv_bias,
            o_bias=config.o_bias,
            qk_norm="plain" if config.qk_norm else None,
            parallel=parallel,
        )
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, bias=config.mlp_bias, parallel=parallel)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    @property
    def mixer(self) -> Attention:
        return self.self_attn

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch, plan: StepPlan
    ) -> torch.Tensor:
        a = self.self_attn(self.input_layernorm(h), cos, sin, batch, plan)
        h = h + (a if self.residual_scale == 1.0 else a * self.residual_scale)
        m = self.mlp(self.post_attention_layernorm(h))
        return h + (m if self.residual_scale == 1.0 else m * self.residual_scale)


class LlamaForCausalLM(CausalLM):
    """A :class:`DecoderConfig` model with Hugging Face's parameter names (``model.layers.{i}.self_attn.q_proj``, …);
    ``parallel``: the tensor-parallel rank it is built for."""

    def __init__(self, config: DecoderConfig, parallel: TensorParallel | None = None):
        super().__init__()
        parallel = parallel or TensorParallel()
        self.model = TextModel(
            VocabParallelEmbedding(config.vocab_size, config.hidden_size, parallel=parallel),
            [LlamaDecoderLayer(config, i, parallel) for i in range(config.num_hidden_layers)],
            RMSNorm(config.hidden_size, config.rms_norm_eps),
        )
        self._finish(config, parallel)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.model.embed_tokens(input_ids)
        return h if self.config.embedding_scale == 1.0 else h * self.config.embedding_scale

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.config.logit_divisor != 1.0:
            hidden = hidden / self.config.logit_divisor
        return self.lm_head(hidden).float()
