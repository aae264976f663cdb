"""What the tensor-parallel tests run on each rank of an ``LLM(tensor_parallel_size=N)`` (through
``LLM.collective_rpc``) — loading its part of a checkpoint and running the same steps — and the single-process run
they are compared with (the same functions with ``TensorParallel()``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from longsparse.distributed import TensorParallel
from longsparse.engine import CompressedKeys, ModelRunner, allocate_caches
from longsparse.models import ExecutionModes, ForecastProjections, load_model
from longsparse.ops.sparse_attn import SparseAttentionConfig


@dataclass(frozen=True)
class Run:
    """One execution-mode setting of a model: ``forecast_seed`` gives ``sparda`` a random Forecast adapter."""

    gdn: str
    attention: str
    forecast_seed: int | None = None

    @property
    def name(self) -> str:
        return f"gdn-{self.gdn}-attention-{self.attention}"


class ReadCounter:
    """Bytes each checkpoint tensor gave out through ``safetensors.safe_open`` (whole tensors and slices alike), so
    that a test sees what a rank read."""

    def __init__(self):
        import safetensors

        self.bytes: Counter[str] = Counter()
        self._module, self._open = safetensors, safetensors.safe_open
        counter = self

        class Handle:
            def __init__(self, *args, **kwargs):
                self._handle = counter._open(*args, **kwargs)

            def keys(self):
                return self._handle.keys()

            def get_tensor(self, name):
                return counter._count(name, self._handle.get_tensor(name))

            def get_slice(self, name):
                return Slice(name, self._handle.get_slice(name))

        class Slice:
            def __init__(self, name, inner):
                self._name, self._inner = name, inner

            def get_shape(self):
                return self._inner.get_shape()

            def __getitem__(self, index):
                return counter._count(self._name, self._inner[index])

        safetensors.safe_open = Handle

    def _count(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        self.bytes[name] += tensor.numel() * tensor.element_size()
        return tensor

    def close(self) -> None:
        self._module.safe_open = self._open


def model_steps(
    parallel: TensorParallel,
    folder: Path,
    runs: list[Run],
    ids: list[int],
    forced: list[int],
    sparse: SparseAttentionConfig,
) -> dict:
    """Load ``folder`` (this rank's part of it), then for each run: a prefill of ``ids`` (every token's logits) and
    one decode step per token of ``forced`` (its logits). Returns ``{"bytes_read": {tensor: bytes}, run name:
    [T + len(forced), vocab] logits}``."""
    counter = ReadCounter()
    try:
        loaded = load_model(folder, dtype=torch.float32, device="cpu", parallel=parallel)
    finally:
        counter.close()
    out: dict = {"bytes_read": dict(counter.bytes)}
    model = loaded.model
    for run in runs:
        forecast = None
        if run.forecast_seed is not None:
            forecast = ForecastProjections.random(loaded.config, seed=run.forecast_seed)
        model.set_modes(ExecutionModes(run.gdn, run.attention), sparse_attention_config=sparse, forecast=forecast)
        out[run.name] = prefill_then_decode(model, ids, forced, sparse)
    return out


def llm_model_steps(llm, *args) -> dict:
    """:func:`model_steps` on the rank of a tensor-parallel :class:`~longsparse.LLM` (``llm.collective_rpc``)."""
    return model_steps(llm.parallel, *args)


def prefill_then_decode(model, ids: list[int], forced: list[int], sparse: SparseAttentionConfig) -> torch.Tensor:
    """Every prompt token's logits, then one decode step per ``forced`` token, with caches sized by the rank's
    share of the heads."""
    config = model.rank_config
    capacity = len(ids) + len(forced)
    kv, states = allocate_caches(config, 1, capacity, torch.float32, "cpu", block_size=sparse.block_size)
    compressed = None
    if model.sparse_attention_layers:
        compressed = CompressedKeys(model.sparse_attention_layers, 1, capacity, config.num_key_value_heads,
                                    config.head_dim, sparse, torch.float32, "cpu")  # fmt: skip
    runner = ModelRunner(model)
    caches = dict(kv_cache=kv, gdn_states=states, compressed_keys=compressed)
    logits = [runner.prefill([ids], all_logits=True, **caches).logits]
    for step, token in enumerate(forced):
        logits.append(runner.decode([token], prefix_lens=[len(ids) + step], slots=[0], **caches).logits)
    return torch.cat(logits)


def assert_each_rank_read_its_share(whole: dict[str, int], ranks: list[dict[str, int]], split) -> None:
    """``whole``: bytes of each checkpoint tensor (what one process reads); ``ranks``: what each rank read.
    ``split(name)``: whether the ranks split that tensor — then together they read it exactly once and none read all
    of it — or each reads it whole."""
    for name, size in whole.items():
        read = [r.get(name, 0) for r in ranks]
        if split(name):
            assert sum(read) == size and all(0 < r < size for r in read), (name, read, size)
        else:
            assert read == [size] * len(ranks), (name, read, size)
