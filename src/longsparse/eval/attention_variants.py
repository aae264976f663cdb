"""Ways of running a model's attention layers for side-by-side accuracy runs on one loaded model.

An :class:`AttentionVariant` names an attention mode — ``dense``, ``sparse`` (InfLLM-V2), ``sparda`` (Forecast) or
``oracle`` (a diagnostic bound: the blocks of largest dense attention mass, same budget) — with its geometry and
rules (a :class:`~longsparse.ops.sparse_attn.SparseAttentionConfig`), the phases that run block-sparse (so that a
loss can be placed in prefill or decode) and the attention layers kept dense. :func:`apply_variant` puts a loaded
``LLM`` into it in place (no reload): the layers' modes through ``set_modes``, then each block-sparse layer's backend
with the variant's phases (and the oracle's selector, which is not a product mode).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..models.modes import ExecutionModes
from ..models.sparse_attention import OracleAttention, SpardaAttention, SparseAttention
from ..ops.sparse_attn.config import SparseAttentionConfig

VARIANT_MODES = ("dense", "sparse", "sparda", "oracle")
PHASES = ("prefill", "decode")
_BACKENDS = {"sparse": SparseAttention, "sparda": SpardaAttention, "oracle": OracleAttention}


@dataclass(frozen=True)
class AttentionVariant:
    """``mode`` with ``config`` (required unless dense); ``sparse_phases``: the phases that run block-sparse (the
    other runs dense; a dense prefill still writes the compressed keys); ``dense_layers``: attention layers that run
    dense whatever the mode (DuoAttention / MInference-style); ``use_kernel``: passed to the backends (None: the
    Triton kernels on a GPU where they implement the rules, else the torch path)."""

    name: str
    mode: str = "dense"
    config: SparseAttentionConfig | None = None
    sparse_phases: tuple[str, ...] = PHASES
    dense_layers: tuple[int, ...] = ()
    use_kernel: bool | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a variant needs a name, got {self.name!r}")
        if self.mode not in VARIANT_MODES:
            raise ValueError(f"mode must be one of {', '.join(VARIANT_MODES)}, got {self.mode!r}")
        if self.mode != "dense" and not isinstance(self.config, SparseAttentionConfig):
            raise ValueError(f"variant {self.name!r}: mode {self.mode!r} needs a SparseAttentionConfig")
        if not self.sparse_phases or not set(self.sparse_phases) <= set(PHASES):
            raise ValueError(f"sparse_phases must name {' and/or '.join(PHASES)}, got {self.sparse_phases!r}")
        if any(not isinstance(i, int) or i < 0 for i in self.dense_layers):
            raise ValueError(f"dense_layers must be layer indices, got {self.dense_layers!r}")

    def with_config(self, name: str, **changes) -> AttentionVariant:
        """The same variant under another name with fields of its config changed."""
        return dataclasses.replace(self, name=name, config=dataclasses.replace(self.config, **changes))

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["sparse_phases"] = list(self.sparse_phases)
        d["dense_layers"] = list(self.dense_layers)
        return d


def apply_variant(llm, variant: AttentionVariant, forecast=None) -> None:
    """Put ``llm`` (a :class:`~longsparse.LLM`) into ``variant``; ``forecast``: the adapter ``sparda`` needs (a
    ``ForecastProjections`` on the model's device and dtype)."""
    model = llm.loaded.model
    attention = model.config.attention_layers
    unknown = sorted(set(variant.dense_layers) - set(attention))
    if unknown:
        raise ValueError(f"variant {variant.name!r}: dense_layers {unknown} are not attention layers of the model")
    if variant.mode == "sparda" and forecast is None:
        raise ValueError(f"variant {variant.name!r} runs sparda and needs a Forecast adapter")
    if variant.mode == "dense":
        modes = ExecutionModes(attention="dense")
    else:
        mode = "sparse" if variant.mode == "oracle" else variant.mode
        modes = ExecutionModes(attention={i: "dense" if i in variant.dense_layers else mode for i in attention})
    model.set_modes(
        modes,
        sparse_attention_config=variant.config,
        forecast=forecast if variant.mode == "sparda" else None,
    )
    for i in model.sparse_attention_layers:
        backend = _BACKENDS[variant.mode](variant.config, variant.use_kernel, sparse_phases=variant.sparse_phases)
        model.model.layers[i].mixer.backend = backend
    for i in attention:
        for emitter in model.model.layers[i].mixer.forecasters:
            emitter.use_kernel = variant.use_kernel
    # the KV cache LLM.generate allocates: whole blocks of the variant's size for block-sparse layers
    if not model.sparse_attention_layers:
        llm.decode_mode = "dense_gpu"
    else:
        llm.decode_mode = "sparda_gpu" if variant.mode == "sparda" else "sparse_gpu"
    model.attention_label = variant.name
