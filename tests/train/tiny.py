"""Tiny models of our own classes with random weights, and a small selection geometry, for Forecast tests."""

from __future__ import annotations

from longsparse.models.config import DecoderConfig, HybridConfig, RopeConfig
from longsparse.models.hybrid import Qwen35ForCausalLM
from longsparse.models.llama import LlamaForCausalLM
from longsparse.ops.sparse_attn import SparseAttentionConfig
from tests.tiny_models import randomize

# block 16, (8, 4) compression, 1 init block, 32-token window: budget 8 = 1 init + 3 local + 4 chosen
SMALL = SparseAttentionConfig(
    block_size=16, init_blocks=1, window=32, topk=6, kernel_size=8, kernel_stride=4, dense_len=0
)
VOCAB = 101


def _common(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, rotary_dim: int) -> dict:
    return dict(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=1e-5,
        rope=RopeConfig(head_dim=head_dim, rotary_dim=rotary_dim),
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )


def tiny_llama(seed: int = 0, layers: int = 3, heads: int = 6, kv_heads: int = 2) -> LlamaForCausalLM:
    """A 3-layer Llama (hidden 32, 6 query / 2 KV heads of 16: G = 3), random weights, frozen, float32."""
    config = DecoderConfig(
        architecture="LlamaForCausalLM", model_type="llama", **_common(layers, 32, heads, kv_heads, 16, 16)
    )
    return randomize(LlamaForCausalLM(config), seed).requires_grad_(False).eval()


def tiny_hybrid(seed: int = 0) -> Qwen35ForCausalLM:
    """A Qwen3.5-style hybrid: GDN, attention, GDN, attention, attention (output gate, q/k norm, partial RoPE)."""
    config = HybridConfig(
        architecture="Qwen3_5ForCausalLM",
        model_type="qwen3_5_text",
        layer_type_list=("linear_attention", "full_attention", "linear_attention", "full_attention", "full_attention"),
        linear_conv_kernel_dim=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        **_common(5, 32, 4, 2, 16, 4),
    )
    return randomize(Qwen35ForCausalLM(config), seed).requires_grad_(False).eval()
