"""Model geometries of the end-to-end benchmark, as transformers configurations, and the pair of models built from one.

A preset is the keyword arguments of a transformers config class (``Qwen3_5TextConfig`` or ``LlamaConfig``); the
benchmark builds transformers' model from it with random weights (seeded) and loads the very same weights into ours
(:func:`build_pair`), so both run one model. Shapes follow the models' published configurations (Qwen3.5-4B:
hidden 2560, FFN 9216; Qwen3.5-9B: hidden 4096, FFN 12288; both 32 layers = 24 GDN + 8 gated attention, 16 q / 4 kv
heads of 256, GDN 16 qk / 32 v heads of 128, vocabulary 248320).

MiniCPM4.1-8B runs as a Llama-architecture model of its shapes (hidden 4096, FFN 16384, 32 layers, 32 q / 2 kv heads of
128, vocabulary 73448): transformers has no MiniCPM class (openbmb's is remote code), and MiniCPM's embedding,
residual and logit scalings and LongRoPE are elementwise, so they do not change where the time goes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

from .._optional import require
from ..models.base import CausalLM
from ..models.loader import empty_model, load_model
from ..models.registry import ARCHITECTURES
from ..ops.sparse_attn import MINICPM4, SparseAttentionConfig

_QWEN35_COMMON = dict(
    num_hidden_layers=32, num_attention_heads=16, num_key_value_heads=4, head_dim=256, full_attention_interval=4,
    linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
    linear_num_value_heads=32, vocab_size=248320, rms_norm_eps=1e-6, max_position_embeddings=262144,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
)  # fmt: skip


@dataclass(frozen=True)
class Geometry:
    """``config``: keyword arguments of ``transformers.<config_class>``; ``architecture``: the transformers model class
    (also the ``architectures`` entry our loader reads); ``sparse``: the block-sparse attention geometry of the
    ``sparse`` / ``sparda`` modes."""

    name: str
    config_class: str
    architecture: str
    config: dict
    sparse: SparseAttentionConfig = field(default=MINICPM4)
    real: bool = True

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"geometry {self.name}: architecture {self.architecture!r} is not supported")

    @property
    def hybrid(self) -> bool:
        return self.architecture.startswith("Qwen3_5")

    @property
    def slug(self) -> str:
        """``qwen3.5-4b`` -> ``qwen35_4b`` (for summary keys)."""
        return self.name.replace(".", "").replace("-", "_")


TINY_SPARSE = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=4, kernel_size=16, kernel_stride=8,
                                    dense_len=64)  # fmt: skip
"""Block-sparse geometry of the tiny CPU presets: prompts of 64+ tokens take the sparse path."""

GEOMETRIES: dict[str, Geometry] = {
    g.name: g
    for g in (
        Geometry("qwen3.5-4b", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
                 dict(_QWEN35_COMMON, hidden_size=2560, intermediate_size=9216, tie_word_embeddings=True)),
        Geometry("qwen3.5-9b", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
                 dict(_QWEN35_COMMON, hidden_size=4096, intermediate_size=12288, tie_word_embeddings=False)),
        Geometry("minicpm4.1-8b", "LlamaConfig", "LlamaForCausalLM",
                 dict(vocab_size=73448, hidden_size=4096, intermediate_size=16384, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=2, head_dim=128, rms_norm_eps=1e-5,
                      max_position_embeddings=262144, tie_word_embeddings=False, rope_theta=10000.0)),
        Geometry("tiny-qwen3.5", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
                 dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, full_attention_interval=2,
                      linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=12,
                      linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=4096,
                      rms_norm_eps=1e-5), TINY_SPARSE, real=False),
        Geometry("tiny-llama", "LlamaConfig", "LlamaForCausalLM",
                 dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                      rms_norm_eps=1e-5), TINY_SPARSE, real=False),
    )
}  # fmt: skip


def hf_gdn_kernel(hf: torch.nn.Module) -> str | None:
    """``"fla"`` if transformers' GDN layers in ``hf`` call FLA's chunked kernel, ``"torch fallback"`` otherwise,
    ``None`` for a model without GDN layers. Read-only inspection of what transformers chose when it imported its
    modeling module: the layer's ``chunk_gated_delta_rule`` attribute or a module-level FLA import (older 5.x), or
    the module-level ``torch_chunk_gated_delta_rule`` and the implementation its dispatch wrapper closed over
    (newer 5.x)."""
    layer = next((m for m in hf.modules() if type(m).__name__.endswith("GatedDeltaNet")), None)
    if layer is None:
        return None
    module = sys.modules.get(type(layer).__module__)
    candidates = [
        getattr(layer, "chunk_gated_delta_rule", None),
        getattr(module, "chunk_gated_delta_rule", None),  # an FLA import at module level
        getattr(module, "torch_chunk_gated_delta_rule", None),
    ]
    for fn in candidates:
        if fn is None:
            continue
        inner = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _filled(c)]
        for f in [fn, *inner]:
            if callable(f) and str(getattr(f, "__module__", "")).startswith("fla"):
                return "fla"
    return "torch fallback"


def _filled(cell) -> bool:
    try:
        return cell.cell_contents is not None
    except ValueError:  # an empty cell
        return False


@dataclass
class ModelPair:
    """transformers' model and ours holding the same weights; ``label`` names the geometry or checkpoint."""

    hf: torch.nn.Module | None
    ours: CausalLM
    label: str
    sparse: SparseAttentionConfig
    hf_error: str | None = None


def build_hf(geometry: Geometry, device: torch.device, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """transformers' model of ``geometry`` with its own random initialisation under ``seed`` (its matrices are
    N(0, 0.02²), close to 1/√fan_in at these widths; norms, ``A_log`` and ``dt_bias`` at their real initial values)."""
    transformers = require("transformers", "the end-to-end benchmark's reference model")
    config = getattr(transformers, geometry.config_class)(**geometry.config)
    model_class = getattr(transformers, geometry.architecture)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        with torch.device(device):
            model = model_class(config)
    # transformers 5 may build (some) weights on the host whatever the device context says: move them explicitly.
    # Only the parameters take ``dtype``: ``model.to(dtype=bf16)`` would also round the rotary embedding's float32
    # ``inv_freq`` buffer to bf16, and rotary angles ``position · inv_freq`` off by up to 2⁻⁹ relative are radians off
    # at thousands of tokens (a MiniCPM4-shaped model's logits were ~1.3 relative from a float32 forward at 8K that
    # way). ``from_pretrained(dtype=…)``, as users load a model, keeps those buffers in float32; so does this.
    model = model.to(device=device)
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point():
                param.data = param.data.to(dtype)
    return model.eval().requires_grad_(False)


def ours_from_hf(hf: torch.nn.Module, architecture: str, device: torch.device, dtype: torch.dtype) -> CausalLM:
    """Our model of transformers' ``hf``, read from its config and holding its weights (names match one to one)."""
    arch = ARCHITECTURES[architecture]
    config = arch.config_from_hf(hf.config.to_dict(), f"transformers {architecture} config")
    model = empty_model(arch, config, dtype, device)
    model.load_state_dict(hf.state_dict(), strict=True)
    return model


def build_pair(geometry: Geometry, device: torch.device, dtype: torch.dtype, seed: int) -> ModelPair:
    hf = build_hf(geometry, device, dtype, seed)
    return ModelPair(hf, ours_from_hf(hf, geometry.architecture, device, dtype), geometry.name, geometry.sparse)


def load_pair(path: str, device: torch.device, dtype: torch.dtype, sparse: SparseAttentionConfig) -> ModelPair:
    """A real checkpoint folder: ours through :func:`~longsparse.models.load_model`, transformers' through
    ``AutoModelForCausalLM.from_pretrained`` (its failure is recorded, ours still runs)."""
    ours = load_model(path, dtype=dtype, device=device).model
    try:
        transformers = require("transformers", "the end-to-end benchmark's reference model")
        # read on the host, then moved: device_map would need accelerate
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        return ModelPair(hf.eval().requires_grad_(False), ours, f"model:{path}", sparse)
    except Exception as exc:  # the row of every transformers case will say why
        return ModelPair(None, ours, f"model:{path}", sparse, hf_error=f"{type(exc).__name__}: {str(exc)[:300]}")
