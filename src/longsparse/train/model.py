"""The trained hybrid's architecture: transformers' own ``Qwen3_5ForCausalLM`` at a small size with Qwen3.5's real
GDN head geometry (16 q/k heads and 32 v heads of 128 channels), so SparseGDN's 16 head pairs and tier table apply.

The default (8 layers, hidden 192, 3 GDN : 1 attention, 8192-token vocabulary, tied embeddings) has 23.8 M parameters:
47.5 MB in bfloat16. The GDN layers hold most of them (each projects the hidden state to 12,288 q/k/v/z channels and
4,096 back), however small the hidden size.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import asdict, dataclass

import torch

from .._optional import require

QWEN35_MODELING = "transformers.models.qwen3_5.modeling_qwen3_5"


@dataclass(frozen=True)
class HybridModelConfig:
    """Sizes of the hybrid; layer ``i`` is full attention when ``(i + 1) % full_attention_interval == 0`` (Qwen3.5's
    rule), GDN otherwise. Attention keeps Qwen3.5's form (output gate, zero-centred q/k norms, partial RoPE 0.25)."""

    vocab_size: int = 8192
    hidden_size: int = 192
    intermediate_size: int = 576
    num_hidden_layers: int = 8
    full_attention_interval: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = True

    def __post_init__(self):
        for name, value in asdict(self).items():
            if name == "tie_word_embeddings":
                if not isinstance(value, bool):
                    raise ValueError(f"tie_word_embeddings must be a bool, got {value!r}")
            elif not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"linear_num_value_heads={self.linear_num_value_heads} must be a multiple of "
                f"linear_num_key_heads={self.linear_num_key_heads}"
            )
        if not any(t == "full_attention" for t in self.layer_types):
            raise ValueError(
                f"num_hidden_layers={self.num_hidden_layers} with full_attention_interval="
                f"{self.full_attention_interval} has no attention layer"
            )

    @property
    def layer_types(self) -> list[str]:
        interval = self.full_attention_interval
        return [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(self.num_hidden_layers)
        ]

    def to_transformers(self, eos_token_id: int):
        """transformers' ``Qwen3_5TextConfig`` with these sizes; ``eos_token_id`` also pads."""
        transformers = require("transformers", "building the hybrid")
        fields = asdict(self)
        fields.pop("full_attention_interval")
        return transformers.Qwen3_5TextConfig(
            **fields,
            layer_types=self.layer_types,
            eos_token_id=eos_token_id,
            pad_token_id=eos_token_id,
            bos_token_id=None,
        )


def import_qwen35_modeling(use_fla: bool):
    """transformers' Qwen3.5 modeling module.

    transformers binds the GDN kernels when this module is first imported: FLA's Triton kernels if ``fla`` imports,
    else its pure-torch reference. FLA's kernels need a GPU, so for ``use_fla=False`` (training on a CPU) the import
    runs with ``fla`` made unimportable for its duration (the ``sys.modules[name] = None`` convention), then restored.
    The choice is made once per process: a module already imported keeps its kernels (ValueError if that contradicts
    ``use_fla``).
    """
    module = sys.modules.get(QWEN35_MODELING)
    if module is None:
        if use_fla:
            module = importlib.import_module(QWEN35_MODELING)
        else:
            saved = sys.modules.get("fla", _ABSENT)
            sys.modules["fla"] = None
            try:
                module = importlib.import_module(QWEN35_MODELING)
            finally:
                if saved is _ABSENT:
                    del sys.modules["fla"]
                else:
                    sys.modules["fla"] = saved
    if use_fla_kernels(module) and not use_fla:
        raise ValueError(
            f"{QWEN35_MODELING} was imported with FLA's GPU kernels before; a CPU model cannot run them in this process"
        )
    return module


def gdn_kernel(module) -> str:
    """The module of the chunked gated delta rule a loaded Qwen3.5 modeling module runs: ``fla.ops...`` for FLA's
    kernels, transformers' own module for its torch reference (read from transformers' dispatch wrapper)."""
    fn = module.torch_chunk_gated_delta_rule
    try:
        implementation = inspect.getclosurevars(fn).nonlocals.get("implementation", fn)
    except TypeError:
        implementation = fn
    return str(getattr(implementation, "__module__", None) or module.__name__)


def use_fla_kernels(module) -> bool:
    return gdn_kernel(module).split(".")[0] == "fla"


_ABSENT = object()


def fla_available() -> bool:
    try:
        importlib.import_module("fla")
    except Exception:
        return False
    return True


def build_model(config: HybridModelConfig, eos_token_id: int, device: torch.device, seed: int):
    """A freshly initialised ``Qwen3_5ForCausalLM`` (float32, transformers' initialisation under ``seed``) on
    ``device``, with FLA's kernels for the GDN layers on a CUDA device when FLA is installed."""
    use_fla = device.type == "cuda" and fla_available()
    modeling = import_qwen35_modeling(use_fla)
    hf_config = config.to_transformers(eos_token_id)
    torch.manual_seed(seed)
    model = modeling.Qwen3_5ForCausalLM(hf_config)
    return model.to(device)


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
