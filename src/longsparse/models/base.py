"""What every causal LM here shares: embeddings → decoder layers → final norm → LM head, over a packed batch."""

from __future__ import annotations

import torch
from torch import nn

from ..distributed import TensorParallel
from ..ops.gdn.heads import HeadSplit
from ..ops.sparse_attn import MINICPM4, SparseAttentionConfig
from .attention import DenseAttention, dense_decode_blocks
from .batch import ForwardBatch
from .config import BaseConfig, HybridConfig
from .forecast import ForecastError, ForecastProjections, forecast_source
from .gdn import make_gdn_core
from .layers import Attention, GatedDeltaNet, RotaryEmbedding
from .modes import ExecutionModes
from .parallel import ParallelLMHead, rank_config
from .plan import StepPlan
from .sparse_attention import ForecastEmitter, make_attention_backend


class TextModel(nn.Module):
    """Hugging Face's ``model.*`` module: ``embed_tokens``, ``layers``, ``norm``."""

    def __init__(self, embed_tokens: nn.Embedding, layers: list[nn.Module], norm: nn.Module):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.layers = nn.ModuleList(layers)
        self.norm = norm


class CausalLM(nn.Module):
    """Base of the decoders. Subclasses build ``self.model`` (a :class:`TextModel`) and call :meth:`_finish`.

    ``plan_step(batch) -> StepPlan`` (once per step, before the layers run);
    ``forward(input_ids [T], batch, plan) -> hidden [T, hidden_size]`` (after the final norm; without a plan it plans
    the step itself); ``compute_logits(hidden [N, hidden_size]) -> [N, vocab_size]`` in float32.

    Under tensor parallelism every rank builds the model with its :class:`TensorParallel` (``parallel``) and runs the
    same steps; ``config`` is the checkpoint's, ``rank_config`` the geometry this rank's layers hold (its caches are
    sized by it), and the logits are the whole vocabulary's on every rank.
    """

    config: BaseConfig
    model: TextModel

    def _finish(self, config: BaseConfig, parallel: TensorParallel) -> None:
        self.config = config
        self.parallel = parallel
        self.rank_config = rank_config(config, parallel)
        self.lm_head = ParallelLMHead(config.hidden_size, config.vocab_size, parallel=parallel)
        self.rotary = RotaryEmbedding(config.rope)
        self.modes = ExecutionModes()
        self.sparse_attention_config: SparseAttentionConfig | None = None
        self.sparse_attention_layers: tuple[int, ...] = ()
        self.attention_label = "dense"
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding matrix with the LM head when the config ties them (again after materialising)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def set_modes(
        self,
        modes: ExecutionModes,
        sparse_gdn_config=None,
        *,
        sparse_attention_config: SparseAttentionConfig | None = None,
        forecast: ForecastProjections | None = None,
        sparse_gdn_kernel_config=None,
    ) -> None:
        """Choose each layer's execution mode (see :mod:`longsparse.models.modes`); raises if a mode is unavailable.

        ``sparse_gdn_config``, ``sparse_gdn_kernel_config``: the SparseGDN op's ``config`` and ``kernel_config`` in
        ``sparse`` GDN layers (None: their defaults).

        ``sparse_attention_config``: geometry of the ``sparse`` / ``sparda`` attention layers (default: the geometry
        the Forecast adapter records it was trained for, else MiniCPM4's).
        ``forecast``: the Forecast adapter, required by ``sparda`` (on this model's device and dtype); attention layer
        ``l`` then runs the projection that chooses the blocks of each ``sparda`` layer after it (see
        :mod:`longsparse.models.forecast`).
        """
        modes.check_layers(self.config.layer_types)
        attention = self.config.attention_layers
        attention_modes = {i: modes.for_layer(i, "full_attention") for i in attention}
        sparse_layers = tuple(i for i in attention if attention_modes[i] != "dense")
        sparda_layers = [i for i in attention if attention_modes[i] == "sparda"]
        config = sparse_attention_config
        if config is None:
            trained = forecast.sparse_config if forecast is not None else None
            config = trained if trained is not None else MINICPM4
        if not isinstance(config, SparseAttentionConfig):
            raise ValueError(f"sparse_attention_config must be a SparseAttentionConfig, got {type(config).__name__}")
        if sparda_layers and forecast is None:
            raise ValueError(
                "attention mode 'sparda' needs a Forecast adapter: pass forecast=PATH (a folder written by "
                "ForecastProjections.save; `--forecast PATH`), or forecast='random' to measure speed only"
            )
        if forecast is not None and not sparda_layers:
            raise ValueError("a Forecast adapter was given but no attention layer runs 'sparda'")
        kv_heads = self.parallel.partition_replicated(self.config.num_key_value_heads, "num_key_value_heads")
        if "sparse" in attention_modes.values() and self.parallel.size > self.config.num_key_value_heads:
            raise ValueError(
                f"attention mode 'sparse' with tensor_parallel_size={self.parallel.size} > num_key_value_heads="
                f"{self.config.num_key_value_heads}: InfLLM-V2 chooses a KV head's blocks from all of its query heads, "
                "which would then lie on several ranks; use 'sparda' (one forecast per KV head) or at most "
                f"{self.config.num_key_value_heads} ranks"
            )
        emitters: dict[int, list[ForecastEmitter]] = {}
        if forecast is not None:
            forecast.check_model(self.config)
            for target in sparda_layers:
                source = forecast_source(attention, target)
                try:
                    weight = forecast.weight_for(target, attention)
                except ForecastError as exc:
                    raise ForecastError(f"sparda on layer {target}: {exc}") from None
                # each rank forecasts for the KV heads it holds: their rows of the projection (one that holds them
                # all uses the adapter's own parameter, which training updates in place)
                if len(kv_heads) < self.config.num_key_value_heads:
                    weight = weight[kv_heads.start * self.config.head_dim : kv_heads.stop * self.config.head_dim]
                emitter = ForecastEmitter(target, weight, len(kv_heads), config)
                emitters.setdefault(source, []).append(emitter)
        head_split = self._gdn_head_split()
        for i, layer in enumerate(self.model.layers):
            mixer = layer.mixer
            mode = modes.for_layer(i, self.config.layer_types[i])
            if isinstance(mixer, GatedDeltaNet):
                mixer.core = make_gdn_core(mode, sparse_gdn_config, sparse_gdn_kernel_config, head_split)
            elif isinstance(mixer, Attention):
                mixer.backend = make_attention_backend(mode, config, counts_blocks=bool(sparse_layers))
                mixer.forecasters = emitters.get(i, [])
        self.modes = modes
        self.sparse_attention_config = config if sparse_layers else None
        self.sparse_attention_layers = sparse_layers
        self.attention_label = _attention_label(attention_modes, forecast)

    def _gdn_head_split(self) -> HeadSplit | None:
        """The GDN value heads this rank holds, for SparseGDN's selection across ranks (None with one rank)."""
        if self.parallel.size == 1 or not isinstance(self.config, HybridConfig):
            return None
        total = self.config.linear_num_value_heads
        heads = self.parallel.partition(total, "linear_num_value_heads")
        return HeadSplit(heads.start, len(heads), total, self.parallel.all_gather)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def plan_step(self, batch: ForwardBatch) -> StepPlan:
        """What the layers of ``batch``'s step share, prepared before they run: the SparseGDN launch plan of a prefill
        whose sparse GDN layers run the GPU kernels, and, for a decode step, the block table of the dense layers that
        run the split-KV kernel and the block selections' top-k counters (see :class:`StepPlan`)."""
        weight = self.lm_head.weight
        plan = StepPlan()
        mixers = [layer.mixer for layer in self.model.layers]
        if not batch.is_decode:
            if any(isinstance(m, GatedDeltaNet) and m.core.plans_launch(weight.device) for m in mixers):
                from ..ops.gdn.launch import plan_for

                cu_seqlens = batch.cu_seqlens if batch.num_seqs > 1 else None  # as the GDN layers pass it
                plan.gdn_launch = plan_for(1, batch.offsets[-1], cu_seqlens, weight.device, batch.offsets)
            return plan
        if batch.compressed_keys is not None:
            plan.topk_counters = batch.compressed_keys.topk_counters
        cache = batch.kv_cache
        if cache is not None and any(
            isinstance(m, Attention)
            and isinstance(m.backend, DenseAttention)
            and m.backend.uses_decode_kernel(cache, weight.device, weight.dtype)
            for m in mixers
        ):
            plan.dense_decode_blocks = dense_decode_blocks(
                batch.num_seqs, self.rank_config.num_key_value_heads, batch.max_seqlen, weight.device
            )
        return plan

    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch, plan: StepPlan | None = None) -> torch.Tensor:
        if input_ids.dim() != 1 or input_ids.shape[0] != batch.offsets[-1]:
            raise ValueError(
                f"input_ids must be the packed [T] tokens of the batch (T={batch.offsets[-1]}), "
                f"got shape {list(input_ids.shape)}"
            )
        plan = plan if plan is not None else self.plan_step(batch)
        h = self.embed(input_ids)
        cos, sin = self.rotary(batch.positions)
        for layer in self.model.layers:
            h = layer(h, cos, sin, batch, plan)
        return self.model.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()


def _attention_label(attention_modes: dict[int, str], forecast: ForecastProjections | None) -> str:
    """``"sparse"`` when every attention layer runs one mode, else e.g. ``"sparse ×6, dense ×2"``; a random Forecast
    adapter is flagged loudly."""
    counts: dict[str, int] = {}
    for mode in attention_modes.values():
        counts[mode] = counts.get(mode, 0) + 1
    label = next(iter(counts)) if len(counts) == 1 else ", ".join(f"{m} ×{n}" for m, n in counts.items())
    if forecast is not None and forecast.random_weights:
        label += " with RANDOM Forecast weights (speed only: block choices are meaningless)"
    return label or "none"
