"""Model configurations, read from a checkpoint's ``config.json`` (or a GGUF file's metadata) into dataclasses.

Two families:

* :class:`DecoderConfig` — Llama-style dense decoders: Llama, SmolLM2, Qwen2, Qwen3 (q/k RMSNorm) and MiniCPM4
  (scaled embeddings, residual branches and logits; LongRoPE).
* :class:`HybridConfig` — Qwen3.5-style hybrids: Gated DeltaNet (GDN) layers and gated full-attention layers, laid
  out by ``layer_types``.

Only what the checkpoint says is used; a value it leaves out takes the default of the configuration class that wrote
it (transformers' ``LlamaConfig``, ``Qwen3_5TextConfig``, …, or openbmb's ``MiniCPMConfig`` for MiniCPM).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

ROPE_TYPES = ("default", "linear", "llama3", "longrope")
LAYER_TYPES = ("full_attention", "linear_attention")


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding of one attention layer.

    The first ``rotary_dim`` of the ``head_dim`` channels are rotated (rotate-half convention, frequencies
    ``theta^(-2i / rotary_dim)``); the rest pass through (partial RoPE). ``rope_type``:

    * ``default`` — plain RoPE.
    * ``linear`` — positions divided by ``factor``.
    * ``llama3`` — Llama 3.1's wavelength-banded frequency scaling (``factor``, ``low_freq_factor``,
      ``high_freq_factor``, ``original_max_position_embeddings``).
    * ``longrope`` — MiniCPM4's LongRoPE: frequency ``i`` divided by ``long_factor[i]`` when
      ``max_position_embeddings > original_max_position_embeddings`` and by ``short_factor[i]`` otherwise, and cos/sin
      scaled by ``sqrt(1 + ln(max / original) / ln(original))`` (1 when max <= original). The choice is made once per
      model, as openbmb's ``MiniCPMLongRoPE`` does when it builds its table at ``max_position_embeddings``, so that a
      KV cache never mixes two frequency sets.
    """

    head_dim: int
    rotary_dim: int
    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    max_position_embeddings: int | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None

    def __post_init__(self):
        _positive_int("head_dim", self.head_dim)
        if not isinstance(self.rotary_dim, int) or self.rotary_dim <= 0 or self.rotary_dim % 2:
            raise ValueError(f"rotary_dim must be a positive even integer, got {self.rotary_dim!r}")
        if self.rotary_dim > self.head_dim:
            raise ValueError(f"rotary_dim={self.rotary_dim} exceeds head_dim={self.head_dim}")
        if not self.theta > 0:
            raise ValueError(f"rope theta must be positive, got {self.theta!r}")
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"unsupported rope_type {self.rope_type!r}; supported: {', '.join(ROPE_TYPES)}")
        if self.rope_type in ("linear", "llama3") and not self.factor > 0:
            raise ValueError(f"rope factor must be positive for rope_type={self.rope_type!r}, got {self.factor!r}")
        if self.rope_type in ("llama3", "longrope") and self.original_max_position_embeddings is None:
            raise ValueError(f"rope_type={self.rope_type!r} needs original_max_position_embeddings")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(
                f"llama3 rope needs high_freq_factor > low_freq_factor, got {self.high_freq_factor} and "
                f"{self.low_freq_factor}"
            )
        if self.rope_type == "longrope":
            if self.max_position_embeddings is None:
                raise ValueError("rope_type='longrope' needs max_position_embeddings")
            for name in ("short_factor", "long_factor"):
                factors = getattr(self, name)
                if factors is None or len(factors) != self.rotary_dim // 2:
                    got = None if factors is None else len(factors)
                    raise ValueError(
                        f"longrope {name} must hold rotary_dim / 2 = {self.rotary_dim // 2} values, got {got}"
                    )

    @property
    def uses_long_factors(self) -> bool:
        """LongRoPE only: whether the long factors are in force (see the class docstring)."""
        return self.max_position_embeddings > self.original_max_position_embeddings

    @property
    def attention_scale(self) -> float:
        """Factor on cos and sin (LongRoPE's magnitude correction; 1 for every other type)."""
        if self.rope_type != "longrope" or not self.uses_long_factors:
            return 1.0
        original = self.original_max_position_embeddings
        return math.sqrt(1.0 + math.log(self.max_position_embeddings / original) / math.log(original))

    @classmethod
    def from_hf(
        cls, raw: dict, head_dim: int, max_position_embeddings: int | None, default_partial: float = 1.0
    ) -> RopeConfig:
        """Read transformers 5's ``rope_parameters`` or the older ``rope_theta`` / ``rope_scaling`` /
        ``partial_rotary_factor`` keys (remote-code configs such as MiniCPM's still use those)."""
        params = dict(raw.get("rope_scaling") or {})
        params.update(raw.get("rope_parameters") or {})
        theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
        partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", default_partial))
        rope_type = params.get("rope_type", params.get("type", "default"))
        original = params.get("original_max_position_embeddings", raw.get("original_max_position_embeddings"))

        def factors(name):
            value = params.get(name)
            return None if value is None else tuple(float(f) for f in value)

        return cls(
            head_dim=head_dim,
            rotary_dim=int(head_dim * partial),
            theta=float(theta),
            rope_type=rope_type,
            factor=float(params.get("factor", 1.0)),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=original,
            max_position_embeddings=max_position_embeddings,
            short_factor=factors("short_factor"),
            long_factor=factors("long_factor"),
        )


@dataclass(frozen=True, kw_only=True)
class BaseConfig:
    """What every decoder here shares. ``architecture`` is the checkpoint's class name (e.g. ``LlamaForCausalLM``);
    ``model_type`` is transformers' family name (``llama``, ``qwen3_5_text``, …), used to map GGUF tensor names."""

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            _positive_int(name, getattr(self, name))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.rope.head_dim != self.head_dim:
            raise ValueError(f"rope.head_dim={self.rope.head_dim} differs from head_dim={self.head_dim}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be positive, got {self.rms_norm_eps!r}")

    @property
    def layer_types(self) -> tuple[str, ...]:
        """``"full_attention"`` or ``"linear_attention"`` (GDN) for each layer."""
        return ("full_attention",) * self.num_hidden_layers

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")


@dataclass(frozen=True, kw_only=True)
class DecoderConfig(BaseConfig):
    """A Llama-style dense decoder.

    ``qkv_bias`` / ``o_bias`` / ``mlp_bias``: biases on those projections (Qwen2 has q/k/v biases). ``qk_norm``:
    RMSNorm over the head dim of q and k before RoPE (Qwen3). MiniCPM4's three scalings: token embeddings are multiplied
    by ``embedding_scale`` (``scale_emb``), each residual branch by ``residual_scale``
    (``scale_depth / sqrt(num_hidden_layers)``), and the final hidden states are divided by ``logit_divisor``
    (``hidden_size / dim_model_base``) before the LM head. All three are 1 for the other models.
    """

    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    embedding_scale: float = 1.0
    residual_scale: float = 1.0
    logit_divisor: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        for name in ("embedding_scale", "residual_scale", "logit_divisor"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")


@dataclass(frozen=True, kw_only=True)
class HybridConfig(BaseConfig):
    """A Qwen3.5-style hybrid: ``layer_types[i]`` is ``"linear_attention"`` (a GDN layer) or ``"full_attention"``
    (gated attention with zero-centred q/k RMSNorm and partial RoPE). GDN geometry: ``linear_num_key_heads`` q/k heads
    of ``linear_key_head_dim``, ``linear_num_value_heads`` v heads of ``linear_value_head_dim``, a causal depthwise conv
    of ``linear_conv_kernel_dim`` taps over the concatenated q, k, v projections."""

    layer_type_list: tuple[str, ...]
    linear_conv_kernel_dim: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    attention_bias: bool = False

    def __post_init__(self):
        super().__post_init__()
        if len(self.layer_type_list) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_type_list)} entries for num_hidden_layers={self.num_hidden_layers}"
            )
        bad = sorted(set(self.layer_type_list) - set(LAYER_TYPES))
        if bad:
            raise ValueError(f"unsupported layer_types {bad}; supported: {', '.join(LAYER_TYPES)}")
        for name in (
            "linear_conv_kernel_dim",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
        ):
            _positive_int(name, getattr(self, name))
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"linear_num_value_heads={self.linear_num_value_heads} must be a multiple of "
                f"linear_num_key_heads={self.linear_num_key_heads}"
            )

    @property
    def layer_types(self) -> tuple[str, ...]:
        return self.layer_type_list

    @property
    def gdn_conv_dim(self) -> int:
        """Channels of the causal conv: q, k (``linear_num_key_heads * linear_key_head_dim`` each) and v."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.gdn_value_dim

    @property
    def gdn_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim


ModelConfig = DecoderConfig | HybridConfig


def _require(raw: dict, key: str, where: str):
    if key not in raw or raw[key] is None:
        raise ValueError(f"{where} has no '{key}'")
    return raw[key]


def _eos_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _check_activation(raw: dict, where: str) -> None:
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{where}: unsupported hidden_act {act!r}; supported: 'silu'")


def _common(raw: dict, architecture: str, where: str, *, tie_default: bool, eps_default: float, partial: float):
    heads = _require(raw, "num_attention_heads", where)
    hidden = _require(raw, "hidden_size", where)
    head_dim = raw.get("head_dim") or hidden // heads
    max_pos = int(raw.get("max_position_embeddings", 2048))
    return dict(
        architecture=architecture,
        model_type=str(raw.get("model_type", "")),
        vocab_size=_require(raw, "vocab_size", where),
        hidden_size=hidden,
        intermediate_size=_require(raw, "intermediate_size", where),
        num_hidden_layers=_require(raw, "num_hidden_layers", where),
        num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rms_norm_eps=float(raw.get("rms_norm_eps", eps_default)),
        rope=RopeConfig.from_hf(raw, head_dim, max_pos, default_partial=partial),
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", tie_default)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_eos_ids(raw.get("eos_token_id")),
    )


def decoder_config_from_hf(raw: dict, architecture: str, where: str = "config.json") -> DecoderConfig:
    """A :class:`DecoderConfig` from a Llama / Qwen2 / Qwen3 / MiniCPM ``config.json`` dict."""
    _check_activation(raw, where)
    if raw.get("use_sliding_window"):
        raise ValueError(f"{where}: sliding-window attention (use_sliding_window=true) is not supported")
    if raw.get("pretraining_tp", 1) != 1:
        raise ValueError(f"{where}: pretraining_tp != 1 is not supported")
    is_minicpm = architecture == "MiniCPMForCausalLM"
    fields = _common(raw, architecture, where, tie_default=is_minicpm, eps_default=1e-6, partial=1.0)
    extra: dict[str, Any] = {}
    if architecture == "Qwen2ForCausalLM":
        extra.update(qkv_bias=True)
    elif architecture == "Qwen3ForCausalLM":
        bias = bool(raw.get("attention_bias", False))
        extra.update(qkv_bias=bias, o_bias=bias, qk_norm=True)
    else:
        bias = bool(raw.get("attention_bias", False))
        extra.update(qkv_bias=bias, o_bias=bias, mlp_bias=bool(raw.get("mlp_bias", False)))
    if is_minicpm:
        # defaults as in openbmb's configuration_minicpm.MiniCPMConfig
        dim_model_base = float(raw.get("dim_model_base", 1))
        extra.update(
            embedding_scale=float(raw.get("scale_emb", 1)),
            residual_scale=float(raw.get("scale_depth", 1)) / math.sqrt(fields["num_hidden_layers"]),
            logit_divisor=fields["hidden_size"] / dim_model_base,
        )
    return DecoderConfig(**fields, **extra)


def hybrid_config_from_hf(raw: dict, architecture: str, where: str = "config.json") -> HybridConfig:
    """A :class:`HybridConfig` from a Qwen3.5 text config dict (``text_config`` of a ConditionalGeneration one)."""
    _check_activation(raw, where)
    fields = _common(raw, architecture, where, tie_default=False, eps_default=1e-6, partial=0.25)
    layers = fields["num_hidden_layers"]
    layer_types = raw.get("layer_types")
    if layer_types is None:
        interval = int(raw.get("full_attention_interval", 4))
        layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    return HybridConfig(
        **fields,
        layer_type_list=tuple(layer_types),
        linear_conv_kernel_dim=raw.get("linear_conv_kernel_dim", 4),
        linear_key_head_dim=raw.get("linear_key_head_dim", 128),
        linear_value_head_dim=raw.get("linear_value_head_dim", 128),
        linear_num_key_heads=raw.get("linear_num_key_heads", 16),
        linear_num_value_heads=raw.get("linear_num_value_heads", 32),
        attention_bias=bool(raw.get("attention_bias", False)),
    )
