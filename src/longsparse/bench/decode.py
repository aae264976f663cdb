"""`longsparse bench decode`: decode throughput of the five KV placements of the comparison in SparDA
(Fu et al., arXiv:2606.04511), Sec. 5.3 and Table 4, with its no-prefetch ablation of Table 10, on one model, side by
side in one process.

MiniCPM4.1-8B geometry with random bf16 weights (32 layers, hidden 4096, 32 query / 2 KV heads, d = 128, FFN 16384,
vocabulary 73448), MiniCPM4's block-sparse configuration (block 64, 1 init block, 2048-token window, top-k 64,
compression 32/16). Contexts 32K and 128K, batches 4 ... 128 as far as memory allows; every case that does not fit is
recorded as OOM (the capacity model decides before allocating; an allocator failure is caught too). Modes:
Dense† (dense attention — the split-KV decode kernel over every block; results recorded before that kernel ran
SDPA, as BENCHMARKS.md notes — KV on the GPU), Sparse† (InfLLM-V2 selection, KV on the GPU), Sparse (InfLLM-V2, KV
in pinned host memory, blocks copied at their layer), SparDA without prefetch and SparDA (Forecast selection one
layer early, copies overlapped with the previous layer). The SparDA modes use a random Forecast adapter
(``ForecastProjections.random``); every mode runs the model's own attention backends
(:mod:`longsparse.models.sparse_attention`), set by :func:`~longsparse.engine.decode_modes.prepare_model`, over the
mode's KV cache (:func:`~longsparse.engine.decode_modes.build_cache`).

Each case fills the cache as a prefill would (random keys and values through the cache's prefill path: compressed
keys, window, host write-back) to just under ``context`` tokens, then decodes greedily: ``--warmup`` eager steps,
``--steps`` timed eager steps, and on a GPU the same step captured as one CUDA graph (prefetch-stream copies
included) and replayed ``--steps`` times — the reported figures; eager ones are kept as ``eager_*`` (eager decode is
bound by Python launch overhead at 32 layers, which hides the overlap being measured). CUDA events time each run.
Recorded per case: tokens/s, ms per step, host->GPU bytes copied per step, the dynamic-block hit rate, the cache's
GPU bytes (allocator delta) and the step's peak workspace per sequence. SparDA cases at ``--cta-batches`` also run
with every copy-kernel CTA quota of ``--cta-quotas`` on the same cache. A microbenchmark compares the UVA copy
kernel (scattered 32 KiB rows straight from pinned memory) with one bulk pinned host->GPU copy of the same bytes and
with a CPU gather + copy.

In the same run, before any timing: offloaded SparDA and Sparse decode the same tokens, selections and logits as
their GPU-resident twins (SparDA†, Sparse†) over a few steps, and the copy kernel moves rows bit for bit; the
summary's ratios are reported only if these checks pass.

Selections of the offloaded cases (``--selections``): ``locality`` — the model's selectors run as always, and the
block cache reads, in their place, block lists replayed from a :class:`~longsparse.bench.locality.LocalityProcess`
fitted to SmolLM2's decode traces on real text (``--locality``; :mod:`longsparse.bench.replay`), so the copies are
those of a trained model's locality; ``random`` — the random-weights model's own selections, nearly independent from
step to step: the worst case for a block cache. ``--batches ... max`` adds each mode's largest batch that fits this
run's GPU memory and pinned host memory, and (``--paper-gpu-mib``) Sparse†'s largest batch within an H100's 80 GB.

The capacity model (per-sequence GPU and host bytes of each mode, as measured here) projects each mode's largest
batch and its throughput on hosts with 1 TB and 2 TB of memory (``projection`` rows, random-weights selections):
step time is fitted as ``a + b·B`` over the measured batches and evaluated at the projected batch. For the replayed
locality, :func:`locality_model` builds the step time from terms each measured in the run (compute of the
GPU-resident twin, copy bytes per sequence, the copy kernel's rate), checks it against the measured cases and
projects it beyond them, on this GPU and within an H100's memory, both with a 2 TB host (``locality_model`` rows).
Projections are labelled as such; the results are saved after every case, so a time-out keeps the finished ones.
"""

from __future__ import annotations

import argparse
import gc
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ..cache import (
    BlockKVCache,
    CacheStep,
    CapacityError,
    CompressedKeys,
    HostBuffer,
    KVCache,
    check_fits,
    max_batch,
)
from ..cache.capacity import DECODE_MODES, host_available_bytes
from ..engine.cache import allocate_compressed_keys
from ..engine.decode_graph import EagerStepper, GraphStepper
from ..engine.decode_modes import GPU_RESERVE, build_cache, mode_footprint, prepare_model
from ..models.config import decoder_config_from_hf
from ..models.forecast import ForecastProjections
from ..models.llama import LlamaForCausalLM
from ..ops._triton import resolve_use_kernel
from ..ops.sparse_attn import MINICPM4, SparseAttentionConfig, compress_keys
from ..ops.transfer import copy_rows, default_cta_quota
from ..reports.plot import panel_plot
from . import BenchmarkResult, format_table
from .locality import LocalityProcess, load_processes
from .replay import SelectionBank, replay_selections
from .timing import Clock, time_steps

NAME = "decode"
MODES = ("dense_gpu", "sparse_gpu", "sparda_gpu", "sparse_offload", "sparda_noprefetch", "sparda")
RESIDENT = ("dense_gpu", "sparse_gpu", "sparda_gpu")
SELECTIONS = ("locality", "random")
"""Where an offloaded case's blocks come from: ``locality`` — the model's selectors run, and the cache reads the
selections of a :class:`~longsparse.bench.locality.LocalityProcess` fitted to a trained model's traces in their
place (:mod:`longsparse.bench.replay`); ``random`` — the random-weights model's own selections, nearly independent
from step to step: the worst case for a block cache."""
SELECTOR_OF_MODE = {
    "sparse_offload": "sparse_infllmv2",
    "sparda_noprefetch": "sparda_trained",
    "sparda": "sparda_trained",
}
"""The traced selector whose locality each offloaded mode replays."""
GIB = 2**30
PINNABLE_FRACTION = 112 / 126
"""Share of the H200 host's memory that could be pinned (112 of its 126 GiB); applied to the projected hosts too."""
PROJECTED_HOSTS = {"1TB": 1 << 40, "2TB": 2 << 40}
HOST_RESERVE = 8 * GIB
PAPER_HOST = 2 << 40
"""The host memory of SparDA's H100 and A100 machines (SparDA App. C)."""
H100_MIB = 81559
"""Device memory of an H100 SXM 80 GB as the driver reports it (MiB): the GPU of SparDA's throughput table."""

MINICPM41_8B = dict(
    vocab_size=73448, hidden_size=4096, intermediate_size=16384, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=2, head_dim=128, rms_norm_eps=1e-5, scale_emb=12, scale_depth=1.4, dim_model_base=256,
    tie_word_embeddings=False, rope_theta=10000.0,
)  # fmt: skip
TINY_MODEL = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, tie_word_embeddings=False,
)  # fmt: skip
TINY_SPARSE = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=6, kernel_size=16, kernel_stride=8,
                                    dense_len=64)  # fmt: skip


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--contexts", default="32768,131072", help="comma-separated context lengths")
    parser.add_argument("--batches", default="4,8,16,32,64,128",
                        help="comma-separated batch sizes; 'max': also each mode's largest batch that fits this run's "
                        "GPU and pinned host memory")  # fmt: skip
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated decode modes")
    parser.add_argument("--selections", default=",".join(SELECTIONS),
                        help="block selections of the offloaded cases, in run order: 'locality' (a trained model's, "
                        "replayed) and/or 'random' (the random-weights model's own: the worst case)")  # fmt: skip
    parser.add_argument("--locality", default="benchmarks/results/locality.json",
                        help="fitted locality processes (`bench locality`) for --selections locality")  # fmt: skip
    parser.add_argument("--paper-gpu-mib", type=int, default=H100_MIB,
                        help="device memory of the paper's H100 (MiB): Sparse† also runs at its largest batch within "
                        "it, and the locality model reports that setting (0: off)")  # fmt: skip
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds after which no new case starts (the finished ones are summarised and saved)",
    )
    parser.add_argument("--steps", type=int, default=8, help="timed decode steps per case")
    parser.add_argument("--warmup", type=int, default=2, help="untimed decode steps per case")
    parser.add_argument("--cta-quotas", default="8,16,32,64", help="copy-kernel CTA quotas swept on SparDA cases")
    parser.add_argument("--cta-batches", default="8,16,32,64", help="SparDA batches that get the CTA sweep")
    parser.add_argument(
        "--host-gib",
        type=float,
        default=None,
        help="pinned host memory to use (default: what the cases need, within what the host has)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eager", action="store_true", help="time eager steps only (no CUDA-graph replays)")
    parser.add_argument("--tiny", action="store_true",
                        help="CPU smoke run: a 3-layer toy model and geometry (times meaningless)")  # fmt: skip


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def random_model(raw: dict, max_len: int, device: torch.device, dtype: torch.dtype, seed: int) -> LlamaForCausalLM:
    """A MiniCPM-architecture decoder with N(0, 1/fan_in) matrices and unit norms, built directly on ``device``."""
    config = decoder_config_from_hf({**raw, "max_position_embeddings": max_len}, "MiniCPMForCausalLM")
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to(dtype).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.dim() >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5, generator=gen)
            else:
                p.fill_(1.0)
    model.tie_weights()
    return model.eval()


def _fill(
    cache: KVCache, compressed: CompressedKeys | None, config, sparse: SparseAttentionConfig, batch: int, prompt: int,
    device, dtype, seed: int,
) -> None:  # fmt: skip
    """Random keys and values of ``prompt`` tokens per sequence, written as a prefill writes them (the KV cache's
    prefill path, and the compressed keys of the block-sparse modes)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    H, d = config.num_key_value_heads, config.head_dim
    use_kernel = resolve_use_kernel(None, device)
    for layer in config.attention_layers:
        for s in range(batch):
            k = torch.randn(prompt, H, d, generator=gen, device=device).to(dtype)
            v = torch.randn(prompt, H, d, generator=gen, device=device).to(dtype)
            step = CacheStep.prefill([prompt], device, slots=[s])
            cache.begin_step(step)
            cache.store(layer, step, k, v)
            cache.end_step(step)
            if compressed is not None:
                k_cmp, _ = compress_keys(k[None], sparse.kernel_size, sparse.kernel_stride, use_kernel=use_kernel)
                compressed.write_prefill(layer, s, k_cmp[0], k)
        _sync(device)  # bounds the staging buffers waiting for their host copies to one layer's


def _transfer(cache) -> dict | None:
    if isinstance(cache, BlockKVCache) and cache.layout.offloaded:
        return cache.transfer_stats()
    return None


def _measure(row: dict, key: str, stepper, cache, steps: int, device, batch: int) -> None:
    """Time ``steps`` steps into ``row[key + "ms_per_step"]`` etc., with the transfers and the peak workspace."""
    _sync(device)
    base = _allocated(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    before = _transfer(cache)
    ms = row[f"{key}ms_per_step"] = time_steps(stepper, steps, device)
    row[f"{key}tokens_per_s"] = batch * 1e3 / ms
    if device.type == "cuda":
        row[f"{key}step_workspace_bytes_per_seq"] = (torch.cuda.max_memory_allocated(device) - base) / batch
    after = _transfer(cache)
    if before is not None:
        moved = after["misses"] - before["misses"]
        dyn = after["dynamic"] - before["dynamic"]
        row[f"{key}bytes_per_step"] = moved * cache.layout.row_bytes / steps
        row[f"{key}hit_rate"] = (after["hits"] - before["hits"]) / dyn if dyn else float("nan")
        row["overflow"] = after["overflow"]


def run_case(ctx, mode, batch, setting, selections="random") -> dict:
    """One (context, mode, batch, selections): fill, warm up, time eager steps and (on a GPU) CUDA-graph replays, sweep
    the CTA quota of SparDA cases; the row of results (``status`` "ok" or "OOM (...)"). ``selections``: see
    :data:`SELECTIONS` (the GPU-resident modes read every selection in place: theirs are the model's own)."""
    model, config, sparse, device, dtype, args = (setting[k] for k in ("model", "config", "sparse", "device",
                                                                       "dtype", "args"))  # fmt: skip
    offloaded = DECODE_MODES[mode].offload
    row = dict(kind="decode", context=ctx, mode=mode, label=DECODE_MODES[mode].label, batch=batch,
               selections=selections if offloaded else "model")  # fmt: skip
    fp = mode_footprint(config, mode, ctx, dtype, sparse)
    row["model_gpu_bytes_per_seq"], row["model_host_bytes_per_seq"] = fp.gpu_per_seq, fp.host_per_seq
    quotas = _ints(args.cta_quotas) if mode == "sparda" and batch in _ints(args.cta_batches) else []
    graphs = setting["graphs"]
    total_steps = args.warmup + (2 if graphs else 1) * args.steps + len(quotas) * (1 + args.steps) + 2
    prompt = ctx - total_steps - 1
    try:
        check_fits(fp, batch, setting["gpu_budget"], setting["host_budget"] if fp.host_per_seq else None)
    except CapacityError as exc:
        row.update(status="OOM (host)" if "host memory" in str(exc) else "OOM (GPU)", reason=str(exc))
        return row
    prepare_model(model, mode, sparse, forecast=setting["forecast"])
    cache = compressed = graph = bank = None
    try:
        before = _allocated(device)
        cache = build_cache(config, mode, batch, ctx, dtype, device, sparse, host_buffer=setting["host_buffer"],
                            check_memory=False)  # fmt: skip
        compressed = allocate_compressed_keys(model, batch, ctx)
        row["cache_gpu_bytes_per_seq"] = (_allocated(device) - before) / batch
        t0 = time.perf_counter()
        _fill(cache, compressed, config, sparse, batch, prompt, device, dtype, args.seed + ctx + batch)
        row["fill_s"] = time.perf_counter() - t0
        if offloaded and selections == "locality":
            process = setting["processes"][SELECTOR_OF_MODE[mode]]
            bank = locality_bank(process, config, sparse, batch, prompt, total_steps, device, args.seed + batch)
            replay_selections(cache, bank)
        gen = torch.Generator(device=device).manual_seed(args.seed)
        ids = torch.randint(0, config.vocab_size, (batch,), generator=gen, device=device)
        dense = mode == "dense_gpu"
        with torch.inference_mode():
            eager = EagerStepper(model, cache, compressed, ids, [prompt] * batch, ctx, dense)
            for _ in range(args.warmup):
                eager.step()
            _measure(row, "eager_", eager, cache, args.steps, device, batch)
            stepper, key = eager, "eager_"
            if graphs:
                try:
                    graph = GraphStepper(model, cache, compressed, eager.ids, eager.lengths, ctx, dense)
                    _measure(row, "graph_", graph, cache, args.steps, device, batch)
                    stepper, key = graph, "graph_"
                except RuntimeError as exc:  # a failed capture: the eager numbers stand, the error is recorded
                    row["graph_error"] = str(exc).splitlines()[0]
                    graph = None
            sweep = {}
            for q in quotas:
                cache.num_ctas = q
                eager = EagerStepper(model, cache, compressed, stepper.ids, stepper.lengths, ctx, dense)
                eager.step()  # compiles the copy kernel for this quota before a capture
                if graph:
                    stepper = GraphStepper(model, cache, compressed, eager.ids, eager.lengths, ctx, dense)
                else:
                    stepper = eager
                sweep[q] = time_steps(stepper, args.steps, device)
        if bank is not None:
            bank.check([n - 1 for n in stepper.lengths])  # every step read a selection of its own position
        for name in ("ms_per_step", "tokens_per_s", "bytes_per_step", "hit_rate", "step_workspace_bytes_per_seq"):
            if f"{key}{name}" in row:
                row[name] = row[f"{key}{name}"]
        row["timed"] = "cuda graph" if key == "graph_" else "eager"
        if "bytes_per_step" in row:
            row["cta_quota"] = default_cta_quota(batch)
            row["copy_gbps_if_serial"] = row["bytes_per_step"] / (row["ms_per_step"] * 1e-3) / 1e9
        if sweep:
            row["cta_sweep_tokens_per_s"] = {q: batch * 1e3 / ms for q, ms in sweep.items()}
            row["cta_best"] = min(sweep, key=sweep.get)
        row["status"] = "ok"
    except torch.cuda.OutOfMemoryError as exc:
        row.update(status="OOM (allocator)", reason=str(exc).splitlines()[0])
    finally:
        del cache, compressed, graph, bank
        _free(device)
    return row


def locality_bank(
    process: LocalityProcess, config, sparse: SparseAttentionConfig, batch: int, start: int, steps: int, device,
    seed: int,
) -> SelectionBank:  # fmt: skip
    """The selections of ``steps`` decode steps from position ``start`` for ``batch`` sequences in slots ``0 …
    batch − 1``, every attention layer and KV head, drawn from ``process``."""
    layers, heads = config.attention_layers, config.num_key_value_heads
    lists = process.selections(sparse, len(layers), batch * heads, start, steps, np.random.default_rng(seed))
    return SelectionBank(lists.reshape(steps, len(layers), batch, heads, -1), layers, start, device)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality of two tensors wherever they live (compared on the host)."""
    return bool(torch.equal(a.view(torch.uint8).cpu(), b.view(torch.uint8).cpu()))


def copy_microbench(
    host: torch.Tensor, device: torch.device, quotas: list[int], seed: int, rows: int, use_kernel: bool | None
) -> list[dict]:
    """UVA gather of ``rows`` scattered 32 KiB rows (MiniCPM's bf16 blocks) vs one bulk pinned copy of the same
    bytes vs a CPU gather + copy (GB/s), each checked bit for bit."""
    rows_host = host[: host.numel() // 16384 * 16384].view(-1, 16384)
    n = min(rows, rows_host.shape[0] // 2)
    if n == 0:
        return []
    gen = torch.Generator(device=device).manual_seed(seed)
    rows_host[: 2 * n].copy_(torch.randint(0, 255, (2 * n, 16384), dtype=torch.uint8, generator=gen, device=device))
    src = torch.randperm(2 * n, generator=torch.Generator().manual_seed(seed))[:n]
    src_dev, dst_dev = src.to(device), torch.arange(n, device=device)
    gpu = torch.empty(n, 16384, dtype=torch.uint8, device=device)
    nbytes = n * 16384
    out = []

    def timed(fn, reps=5):
        fn()
        times = []
        for _ in range(reps):
            with Clock(device) as c:
                fn()
            times.append(c.ms)
        return float(np.median(times))

    bulk_ms = timed(lambda: gpu.copy_(rows_host[:n], non_blocking=True))
    out.append(dict(kind="copy", path="bulk pinned H2D (one copy)", bytes=nbytes, ms=bulk_ms,
                    gbps=nbytes / bulk_ms / 1e6, bit_exact=_bits_equal(gpu, rows_host[:n])))  # fmt: skip
    for q in quotas:
        gpu.zero_()
        ms = timed(lambda q=q: copy_rows(rows_host, gpu, src_dev, dst_dev, num_ctas=q, use_kernel=use_kernel))
        out.append(dict(kind="copy", path=f"UVA gather kernel, {q} CTAs", ctas=q, bytes=nbytes, ms=ms,
                        gbps=nbytes / ms / 1e6, bit_exact=_bits_equal(gpu, rows_host[src])))  # fmt: skip
    back = torch.empty(n, 16384, dtype=torch.uint8).pin_memory() if device.type == "cuda" else None
    if back is not None:
        ms = timed(lambda: copy_rows(gpu, back, dst_dev, dst_dev, num_ctas=16))
        out.append(dict(kind="copy", path="UVA write kernel (GPU -> pinned), 16 CTAs", ctas=16, bytes=nbytes, ms=ms,
                        gbps=nbytes / ms / 1e6, bit_exact=_bits_equal(back, gpu.cpu())))  # fmt: skip
        staging = torch.empty(n, 16384, dtype=torch.uint8).pin_memory()

        def cpu_gather():
            torch.index_select(rows_host, 0, src, out=staging)
            gpu.copy_(staging, non_blocking=True)

        ms = timed(cpu_gather)
        out.append(dict(kind="copy", path="CPU gather + bulk copy", bytes=nbytes, ms=ms, gbps=nbytes / ms / 1e6,
                        bit_exact=_bits_equal(gpu, rows_host[src])))  # fmt: skip
    return out


def correctness_checks(setting, context: int, steps: int = 6) -> dict:
    """Offloaded modes against their GPU-resident twins on the bench model, eagerly and (on a GPU) as CUDA-graph
    replays: selections, tokens and logits equal — with the model's own selections, and (``locality`` among the run's
    selections) with both caches reading the same replayed selections, whose hits exercise the slot reuse."""
    model, config, sparse, device, dtype = (setting[k] for k in ("model", "config", "sparse", "device", "dtype"))
    checks = {}
    variants = ["random"] + (["locality"] if "locality" in setting["selections"] else [])
    prompt = context - 2 * steps - 2
    for selections in variants:
        suffix = "" if selections == "random" else "_locality"
        for resident, offloaded in (("sparse_gpu", "sparse_offload"), ("sparda_gpu", "sparda")):
            runs = {}
            for mode in (resident, offloaded):
                prepare_model(model, mode, sparse, forecast=setting["forecast"])
                cache = build_cache(config, mode, 2, context, dtype, device, sparse,
                                    host_buffer=setting["host_buffer"], check_memory=False)  # fmt: skip
                compressed = allocate_compressed_keys(model, 2, context)
                cache.selection_log = []
                _fill(cache, compressed, config, sparse, 2, prompt, device, dtype, seed=1234)
                if selections == "locality":
                    process = setting["processes"][SELECTOR_OF_MODE[offloaded]]
                    replay_selections(
                        cache, locality_bank(process, config, sparse, 2, prompt, 2 * steps + 2, device, 7)
                    )
                with torch.inference_mode():
                    stepper = EagerStepper(model, cache, compressed, torch.tensor([3, 5], device=device),
                                           [prompt] * 2, context, dense=False)  # fmt: skip
                    logits = [stepper.step() for _ in range(steps)]
                    if setting["graphs"]:
                        try:
                            stepper = GraphStepper(model, cache, compressed, stepper.ids, stepper.lengths, context,
                                                   dense=False)  # fmt: skip
                            logits += [stepper.step().clone() for _ in range(steps)]
                        except RuntimeError as exc:  # no graphs in this run: every case is timed eagerly
                            checks["graph_error"] = str(exc).splitlines()[0]
                            setting["graphs"] = False
                    _sync(device)
                runs[mode] = (torch.stack(logits).float().cpu(), [s.cpu() for _, s in cache.selection_log])
                if mode == offloaded:
                    checks[f"check_{offloaded}{suffix}_hit_rate"] = cache.transfer_stats()["hit_rate"]
                del cache, compressed, stepper
                _free(device)
            (la, sa), (lb, sb) = runs[resident], runs[offloaded]
            checks[f"check_{offloaded}{suffix}_selection_equal"] = len(sa) == len(sb) and all(map(torch.equal, sa, sb))
            checks[f"check_{offloaded}{suffix}_tokens_equal"] = bool(torch.equal(la.argmax(-1), lb.argmax(-1)))
            checks[f"check_{offloaded}{suffix}_logits_max_abs_diff"] = float((la - lb).abs().max())
    return checks


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """``(a, b)`` of step ms ≈ a + b·B (least squares; through the origin with one point)."""
    if len(points) == 1:
        b, ms = points[0]
        return 0.0, ms / b
    slope, intercept = np.polyfit([p[0] for p in points], [p[1] for p in points], 1)
    return float(max(intercept, 0.0)), float(max(slope, 1e-9))


def _decode_rows(res: BenchmarkResult, ctx: int | None = None, mode: str | None = None, selections=None) -> list:
    """The finished decode rows, optionally of one context, mode and selections (``"model"``: the GPU-resident modes;
    rows of runs that predate the field count as ``"random"``)."""
    return [
        r for r in res.rows
        if r.get("kind") == "decode" and r.get("status") == "ok" and (ctx is None or r["context"] == ctx)
        and (mode is None or r["mode"] == mode)
        and (selections is None or r.get("selections", "model" if r["mode"] in RESIDENT else "random") in selections)
    ]  # fmt: skip


def _measured_footprint(rows: list[dict], setting, mode: str, ctx: int):
    """``mode``'s footprint at ``ctx`` with the per-sequence GPU bytes and step workspace raised to what ``rows``
    measured where that is more than the model's."""
    fp = mode_footprint(setting["config"], mode, ctx, setting["dtype"], setting["sparse"])
    measured_cache = max(r["cache_gpu_bytes_per_seq"] for r in rows)
    workspace = max((r.get("step_workspace_bytes_per_seq") or 0) for r in rows)
    return replace(fp, gpu_per_seq=max(fp.gpu_per_seq, int(measured_cache)),
                   step_bytes_per_seq=max(fp.step_bytes_per_seq, int(workspace)))  # fmt: skip


def projections(res: BenchmarkResult, setting) -> dict:
    """Largest batch of each mode per context on this GPU (its free memory measured here) with this host's pinnable
    memory (``MemAvailable`` − 8 GiB, not just what the run pinned), 1 TB and 2 TB; projected tokens/s there from the
    step time fitted as ``a + b·B`` over the measured batches — of the model's own (random-weights) selections, the
    worst case; :func:`locality_model` projects the replayed locality. Adds ``projection`` rows; returns {(mode, ctx,
    host): row}."""
    out = {}
    ok = _decode_rows(res, selections=("model", "random"))
    for ctx in sorted({r["context"] for r in ok}):
        for mode in MODES:
            rows = [r for r in ok if r["mode"] == mode and r["context"] == ctx]
            if not rows:
                continue
            pts = sorted((r["batch"], r["ms_per_step"]) for r in rows)
            fp = _measured_footprint(rows, setting, mode, ctx)
            a, b = _fit(pts)
            hosts = {"this host": setting["host_cap"]}
            hosts |= {name: int(PINNABLE_FRACTION * size) for name, size in PROJECTED_HOSTS.items()}
            for host_name, budget in hosts.items():
                batch = max_batch(fp, setting["gpu_budget"], budget if fp.host_per_seq else None)
                tok = batch * 1e3 / (a + b * batch) if batch else 0.0
                row = res.add(kind="projection", projection=True, context=ctx, mode=mode, host=host_name,
                              largest_batch=batch, projected_tokens_per_s=tok, step_ms_fit=(a, b),
                              gpu_bytes_per_seq=fp.gpu_per_seq + fp.step_bytes_per_seq,
                              host_bytes_per_seq=fp.host_per_seq,
                              measured_batches=[p[0] for p in pts])  # fmt: skip
                out[(mode, ctx, host_name)] = row
    return out


def _copy_gbps(res: BenchmarkResult) -> float | None:
    """The UVA gather kernel's best bit-exact rate of the copy microbenchmark (GB/s)."""
    rates = [r["gbps"] for r in res.rows if r.get("kind") == "copy" and r["path"].startswith("UVA gather")
             and r["bit_exact"]]  # fmt: skip
    return max(rates) if rates else None


TWIN = {"sparse_offload": "sparse_gpu", "sparda_noprefetch": "sparda_gpu", "sparda": "sparda_gpu"}
"""The GPU-resident mode whose step is an offloaded mode's step without its copies."""


def locality_model(res: BenchmarkResult, setting, ctx: int) -> dict:
    """Step time of the offloaded modes under the replayed locality from terms each measured in this run, checked
    against the measured cases and projected to batches beyond them. Adds ``locality_model`` rows; returns the
    summary figures (empty where a term is missing).

    Terms: compute ``c(B) = a + b·B`` fitted over the GPU-resident twin's measured steps (the same step without copies:
    :data:`TWIN`); copy bytes per sequence and step ``β`` measured by the offloaded cases (the block cache's miss
    counters); the copy rate ``R`` of the UVA gather kernel (microbenchmark). Model: ``max(c, βB/R)`` for SparDA (the
    copy overlaps the previous layer), ``c + βB/R`` for the modes that copy at the layer. Beyond the largest measured
    batch ``B_m`` the projection is the model scaled by measured/model at ``B_m`` (continuous with the measurement);
    within the measured range only measurements count. Settings: this GPU (its free memory) and the paper's (an H100's
    ``--paper-gpu-mib`` less what this process held before the cache), both with a 2 TB host (pinnable share of this
    host's applied); each compares with Sparse†'s measured peak within the same GPU memory."""
    rate = _copy_gbps(res)
    compute = {}
    for twin in set(TWIN.values()):
        pts = sorted((r["batch"], r["ms_per_step"]) for r in _decode_rows(res, ctx, twin))
        if len(pts) >= 2:
            compute[twin] = _fit(pts)
    sparse_gpu = _decode_rows(res, ctx, "sparse_gpu")
    settings = {"this_gpu_2tb": setting["gpu_budget"], "h100_budget_2tb": setting.get("paper_gpu_budget")}
    host = int(PINNABLE_FRACTION * PAPER_HOST)
    out = {}
    for mode, twin in TWIN.items():
        measured = sorted(_decode_rows(res, ctx, mode, ("locality",)), key=lambda r: r["batch"])
        if not measured or twin not in compute or not rate:
            continue
        a, b = compute[twin]
        beta = float(np.mean([r["bytes_per_step"] / r["batch"] for r in measured]))

        def model_ms(B, a=a, b=b, beta=beta, mode=mode):
            c, x = a + b * B, beta * B / (rate * 1e6)
            return max(c, x) if mode == "sparda" else c + x

        for r in measured:
            r["model_ms_per_step"] = model_ms(r["batch"])
            r["measured_over_model"] = r["ms_per_step"] / r["model_ms_per_step"]
        edge = measured[-1]
        anchor = edge["measured_over_model"]
        fp = _measured_footprint(measured, setting, mode, ctx)
        terms = dict(compute_ms_fit=(a, b), compute_fit_batches=[p["batch"] for p in _decode_rows(res, ctx, twin)],
                     copy_bytes_per_seq_step=beta, copy_gbps=rate, anchor=anchor,
                     link_ceiling_tokens_per_s=rate * 1e9 / beta if beta else None,
                     compute_ceiling_tokens_per_s=1e3 / b if b else None)  # fmt: skip
        for name, gpu_budget in settings.items():
            if gpu_budget is None:
                continue
            largest = max_batch(fp, gpu_budget, host)
            best = max((r for r in measured if r["batch"] <= largest), key=lambda r: r["tokens_per_s"], default=None)
            peak, peak_batch, projected = (best["tokens_per_s"], best["batch"], False) if best else (0.0, 0, False)
            curve = {}
            if largest > edge["batch"]:  # a log-spaced grid up to the largest batch (the peak lies at its end)
                grid = np.unique(np.geomspace(edge["batch"] + 1, largest, 48).round().astype(int))
                for B in (*grid.tolist(), largest):
                    curve[B] = tok = B * 1e3 / (anchor * model_ms(B))
                    if tok > peak:
                        peak, peak_batch, projected = tok, B, True
            # the model's footprint, as the run chose Sparse†'s largest batch in each setting with it
            sparse_fp = mode_footprint(setting["config"], "sparse_gpu", ctx, setting["dtype"], setting["sparse"])
            baseline = [r for r in sparse_gpu if r["batch"] <= max_batch(sparse_fp, gpu_budget, None)]
            sparse_peak = max((r["tokens_per_s"] for r in baseline), default=None)
            row = res.add(kind="locality_model", context=ctx, mode=mode, setting=name, largest_batch=largest,
                          peak_tokens_per_s=peak, peak_batch=peak_batch, peak_projected=projected,
                          sparse_gpu_peak_tokens_per_s=sparse_peak,
                          sparse_gpu_peak_batch=max(baseline, key=lambda r: r["tokens_per_s"])["batch"] if baseline
                          else None,
                          curve={B: curve[B] for B in sorted(curve)},
                          measured=[(r["batch"], r["tokens_per_s"], r["model_ms_per_step"]) for r in measured],
                          **terms)  # fmt: skip
            out[(mode, name)] = row
    return out


def _pin(buffer: HostBuffer, nbytes: int) -> torch.Tensor:
    """Pin ``nbytes``, or as much as the host allows (3/4 at a time; cases that no longer fit are then OOM)."""
    while True:
        try:
            return buffer.view(nbytes)
        except RuntimeError as exc:
            if nbytes <= GIB:
                raise
            print(f"{exc}; trying {0.75 * nbytes / GIB:.1f} GiB", flush=True)
            nbytes = int(0.75 * nbytes)


def _pinned_size(config, sparse, dtype, contexts, batches, modes, cap: int) -> int:
    """The largest host store any requested offloaded case needs within ``cap`` bytes."""
    need = 0
    for ctx in contexts:
        for mode in modes:
            fp = mode_footprint(config, mode, ctx, dtype, sparse)
            for b in batches:
                if fp.host_per_seq and fp.host_bytes(b) <= cap:
                    need = max(need, fp.host_bytes(b))
    return need


def _summarise(res: BenchmarkResult, proj: dict, checks_ok: bool, big: int) -> None:
    def tok(mode, ctx, batch):
        for r in res.rows:
            if (r.get("kind"), r.get("mode"), r.get("context"), r.get("batch"), r.get("status")) == (
                "decode",
                mode,
                ctx,
                batch,
                "ok",
            ):
                return r["tokens_per_s"]
        return None

    def ratio(a, b):
        return a / b if a and b and checks_ok else None

    def rows(mode, ctx):
        return [r for r in res.rows if r.get("kind") == "decode" and r.get("mode") == mode
                and r.get("context") == ctx and r.get("status") == "ok"]  # fmt: skip

    s = res.summary
    s["checks_pass"] = checks_ok
    s["sparda_vs_sparse_offload_b8_128k"] = ratio(tok("sparda", big, 8), tok("sparse_offload", big, 8))
    s["sparda_vs_sparda_noprefetch_b16_128k"] = ratio(tok("sparda", big, 16), tok("sparda_noprefetch", big, 16))
    copies = [r for r in res.rows if r.get("kind") == "copy"]
    uva = max((r["gbps"] for r in copies if r["path"].startswith("UVA gather") and r["bit_exact"]), default=None)
    bulk = next((r["gbps"] for r in copies if r["path"].startswith("bulk")), None)
    s["uva_copy_vs_bulk_h2d"] = uva / bulk if uva and bulk else None
    hit = [r["hit_rate"] for r in rows("sparda", big) if not math.isnan(r.get("hit_rate", math.nan))]
    s["hit_rate_128k"] = sum(hit) / len(hit) if hit else None
    for mode in ("sparda", "sparse_gpu"):
        measured = [r["cache_gpu_bytes_per_seq"] for r in rows(mode, big)]
        s[f"gpu_bytes_per_seq_128k_{mode}"] = min(measured) if measured else None
    sparse_peak = max((r["tokens_per_s"] for r in rows("sparse_gpu", big)), default=None)
    projected = proj.get(("sparda", big, "2TB"))
    s["projected_peak_ratio_2tb_128k"] = (
        projected["projected_tokens_per_s"] / sparse_peak if projected and sparse_peak and checks_ok else None
    )
    best = {}
    for r in res.rows:
        if r.get("cta_best") is not None:
            best[f"{r['context'] // 1024}k_b{r['batch']}"] = r["cta_best"]
    s["cta_quota_best"] = best
    s["largest_batch_measured"] = {
        f"{mode}_{ctx // 1024}k": max((r["batch"] for r in rows(mode, ctx)), default=0)
        for mode in MODES for ctx in sorted({r["context"] for r in res.rows if r.get("kind") == "decode"})
    }  # fmt: skip


def _summarise_locality(res: BenchmarkResult, model: dict, checks_ok: bool, big: int) -> None:
    """The summary keys of the replayed-locality cases at context ``big`` (None where not measured or a check
    failed)."""
    s = res.summary

    def gate(x):
        return x if x is not None and checks_ok else None

    def tok(mode, batch):
        rows = [r for r in _decode_rows(res, big, mode, ("locality",)) if r["batch"] == batch]
        return rows[0]["tokens_per_s"] if rows else None

    def tok_resident(mode, batch):
        rows = [r for r in _decode_rows(res, big, mode) if r["batch"] == batch]
        return rows[0]["tokens_per_s"] if rows else None

    hits = [r["hit_rate"] for r in _decode_rows(res, big, "sparda", ("locality",)) if r.get("hit_rate") is not None]
    s["hit_rate_replayed_128k"] = float(np.mean(hits)) if hits else None
    a, b = tok("sparda", 8), tok("sparse_offload", 8)
    s["sparda_vs_sparse_offload_b8_128k_locality"] = gate(a / b if a and b else None)
    s["sparda_vs_sparse_offload_128k_locality_by_batch"] = {
        r["batch"]: gate(tok("sparda", r["batch"]) / r["tokens_per_s"] if tok("sparda", r["batch"]) else None)
        for r in _decode_rows(res, big, "sparse_offload", ("locality",))
    }
    sparda = max((r["tokens_per_s"] for r in _decode_rows(res, big, "sparda", ("locality",))), default=None)
    sparse_gpu = max((r["tokens_per_s"] for r in _decode_rows(res, big, "sparse_gpu")), default=None)
    s["sparda_peak_vs_sparse_gpu_peak_128k_measured"] = gate(sparda / sparse_gpu if sparda and sparse_gpu else None)
    for setting, key in (("this_gpu_2tb", "projected_peak_ratio_2tb_128k_locality"),
                         ("h100_budget_2tb", "projected_peak_ratio_2tb_128k_h100_budget")):  # fmt: skip
        row = model.get(("sparda", setting))
        ok = row is not None and row["sparse_gpu_peak_tokens_per_s"]
        s[key] = gate(row["peak_tokens_per_s"] / row["sparse_gpu_peak_tokens_per_s"] if ok else None)
        s[f"{key}_link_bound"] = gate(row["link_ceiling_tokens_per_s"] / row["sparse_gpu_peak_tokens_per_s"]
                                      if ok and row["link_ceiling_tokens_per_s"] else None)  # fmt: skip
    # the paper's 5.28 divides by Sparse† at batch 4, the most its engine fitted in 80 GB at 128K
    row, b4 = model.get(("sparda", "h100_budget_2tb")), tok_resident("sparse_gpu", 4)
    s["projected_peak_ratio_2tb_128k_h100_budget_vs_sparse_gpu_b4"] = gate(
        row["peak_tokens_per_s"] / b4 if row is not None and b4 else None
    )
    s["locality_terms_128k"] = {
        f"{mode}_{setting}": {k: row[k] for k in ("largest_batch", "peak_batch", "peak_projected", "peak_tokens_per_s",
                                                  "sparse_gpu_peak_batch", "sparse_gpu_peak_tokens_per_s",
                                                  "compute_ms_fit", "copy_bytes_per_seq_step", "copy_gbps", "anchor",
                                                  "link_ceiling_tokens_per_s", "compute_ceiling_tokens_per_s")}
        for (mode, setting), row in model.items()
    }  # fmt: skip


def _batch_plan(mode: str, ctx: int, batches: list[int], want_max: bool, setting) -> list[int]:
    """The batches to run ``mode`` at: ``batches``, plus (``want_max``) its largest batch within this run's GPU budget
    and pinned host memory and, for the GPU-resident block-sparse modes, the largest within the paper's GPU."""
    plan = set(batches)
    fp = mode_footprint(setting["config"], mode, ctx, setting["dtype"], setting["sparse"])
    cap = setting["max_batch_cap"]
    if want_max:
        largest = max_batch(fp, setting["gpu_budget"], setting["host_budget"] if fp.host_per_seq else None)
        plan.add(min(largest, cap))
    paper = setting.get("paper_gpu_budget")
    if mode == "sparse_gpu" and paper is not None:
        plan.add(min(max_batch(fp, paper, None), cap))
    return sorted(b for b in plan if b > 0)


def _sweep(res: BenchmarkResult, contexts, modes, batches, want_max, setting, checkpoint) -> None:
    """Every case in order — per context: the GPU-resident modes and the offloaded ones with the first selections,
    then the offloaded ones with the others; once a batch does not fit, the larger ones of that mode are recorded with
    the same status without being run. ``checkpoint()`` after each case (results saved as they come); past
    ``--time-limit`` the remaining cases are recorded as skipped."""
    args = setting["args"]
    selections = setting["selections"]
    for ctx in contexts:
        for k, sel in enumerate(selections):
            for mode in modes:
                resident = not DECODE_MODES[mode].offload
                if resident and k > 0:
                    continue
                failed = None
                for batch in _batch_plan(mode, ctx, batches, want_max, setting):
                    base = dict(kind="decode", context=ctx, mode=mode, label=DECODE_MODES[mode].label, batch=batch,
                                selections="model" if resident else sel)  # fmt: skip
                    if args.time_limit is not None and time.perf_counter() - setting["t0"] > args.time_limit:
                        res.add(**base, status="skipped", reason=f"--time-limit {args.time_limit} s reached")
                        continue
                    if failed is not None:
                        res.add(**base, status=failed, reason="a smaller batch did not fit")
                        continue
                    row = res.add(**run_case(ctx, mode, batch, setting, sel))
                    print(f"{ctx:>7} {mode:>17} {row['selections']:>8} B={batch:<4} {row['status']:<16} "
                          f"{row.get('tokens_per_s', float('nan')):9.1f} tok/s  "
                          f"hit {row.get('hit_rate', float('nan')):.3f}  "
                          f"{row.get('bytes_per_step', 0) / 1e6:8.1f} MB/step", flush=True)  # fmt: skip
                    checkpoint()
                    if row["status"] != "ok":
                        failed = row["status"]


def plot(rows: list[dict], path: Path) -> Path:
    """Tokens/s against batch, one panel per context, one line per mode and selections (missing points: the batch did
    not fit)."""
    decode_rows = [r for r in rows if r.get("kind") == "decode"]
    batches = sorted({r["batch"] for r in decode_rows})
    panels = {}
    for ctx in sorted({r["context"] for r in decode_rows}):
        series = {}
        for m in MODES:
            for sel in ("model", *SELECTIONS):
                pts = {r["batch"]: r.get("tokens_per_s") for r in decode_rows if r["mode"] == m and r["context"] == ctx
                       and r.get("selections", "random") == sel and r["status"] == "ok"}  # fmt: skip
                if pts:
                    name = DECODE_MODES[m].label + {"model": "", "locality": " (trained locality)",
                                                    "random": " (random weights: worst case)"}[sel]  # fmt: skip
                    series[name] = [pts.get(b) for b in batches]
        panels[f"{ctx // 1024}K context"] = series
    return panel_plot(path, batches, panels, title="Decode throughput (H200, MiniCPM4.1-8B geometry, random weights; "
                      "'trained locality': selections replayed from SmolLM2's traces); missing points: OOM",
                      xlabel="batch", ylabel="tokens/s")  # fmt: skip


def plot_locality(rows: list[dict], path: Path) -> Path | None:
    """The replayed-locality model at the longest context: measured tokens/s (points), the projection beyond them
    (lines) in both GPU settings, Sparse†'s measured peak within each, and the PCIe link's ceiling."""
    from ..reports.plot import pyplot, save_figure

    model_rows = [r for r in rows if r.get("kind") == "locality_model"]
    if not model_rows:
        return None
    ctx = max(r["context"] for r in model_rows)
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), dpi=120, squeeze=False)
    for ax, setting in zip(axes[0], ("this_gpu_2tb", "h100_budget_2tb")):
        mine = [r for r in model_rows if r["setting"] == setting and r["context"] == ctx]
        for i, r in enumerate(mine):
            c = f"C{i}"
            label = DECODE_MODES[r["mode"]].label
            ax.plot([m[0] for m in r["measured"]], [m[1] for m in r["measured"]], "o", color=c,
                    label=f"{label}: measured")  # fmt: skip
            if r["curve"]:
                xs = sorted(int(b) for b in r["curve"])
                ax.plot(xs, [r["curve"][b] for b in xs], "--", color=c, label=f"{label}: projected")
            if r["mode"] == "sparda" and r["link_ceiling_tokens_per_s"]:
                ax.axhline(r["link_ceiling_tokens_per_s"], color=c, ls=":", label="SparDA: PCIe ceiling R/β")
                ax.axvline(
                    r["largest_batch"], color=c, ls="-.", alpha=0.5, label=f"SparDA largest batch {r['largest_batch']}"
                )
        if mine and mine[0]["sparse_gpu_peak_tokens_per_s"]:
            ax.axhline(mine[0]["sparse_gpu_peak_tokens_per_s"], color="k", ls="-", alpha=0.6,
                       label=f"Sparse† peak, measured (B={mine[0]['sparse_gpu_peak_batch']})")  # fmt: skip
        title = {"this_gpu_2tb": "this GPU, 2 TB host", "h100_budget_2tb": "GPU memory of an 80 GB H100, 2 TB host"}[
            setting
        ]
        ax.set(title=f"{ctx // 1024}K, {title}", xlabel="batch", ylabel="tokens/s", xscale="log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Offloaded decode under a trained model's locality (replayed): measured and projected", fontsize=10)
    return save_figure(fig, path)


def _batches(text: str) -> tuple[list[int], bool]:
    """``--batches``: the integers, and whether ``max`` was asked for."""
    parts = [x.strip() for x in text.split(",") if x.strip()]
    return [int(x) for x in parts if x != "max"], "max" in parts


def run(args) -> int:
    t_start = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    contexts = _ints(args.contexts)
    batches, want_max = _batches(args.batches)
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise ValueError(f"--modes: unknown mode {m!r}; choose from {', '.join(MODES)}")
    selections = [x for x in args.selections.split(",") if x]
    for x in selections:
        if x not in SELECTIONS:
            raise ValueError(f"--selections: unknown {x!r}; choose from {', '.join(SELECTIONS)}")
    if not selections:
        raise ValueError("--selections: name at least one of " + ", ".join(SELECTIONS))
    processes = load_processes(args.locality) if "locality" in selections else {}
    missing = {SELECTOR_OF_MODE[m] for m in modes if m in SELECTOR_OF_MODE} - set(processes)
    if processes and missing:
        raise ValueError(f"{args.locality} has no fitted process for {sorted(missing)}")
    if args.tiny:
        contexts, batches = [300], [2, 4]
        raw, sparse = TINY_MODEL, TINY_SPARSE
    else:
        raw, sparse = MINICPM41_8B, MINICPM4
    res = BenchmarkResult(NAME)
    res.notes.append(
        "Random weights: selections (InfLLM-V2 from random queries, Forecast from a random adapter) are those of an "
        "untrained model; rows with selections='random' are therefore the worst case for the block cache (hit rate "
        "~3 % at 128K). Rows with selections='locality' run the same model, selectors and cache, with the cache "
        "reading block lists replayed from a LocalityProcess fitted to SmolLM2-135M's decode traces on real text "
        f"({args.locality}; SparDA with the trained adapter for the SparDA modes, InfLLM-V2 for Sparse); see "
        "docs/offload.md. locality_model rows: the measured-terms model and its projection beyond the measured "
        "batches."
    )
    model = random_model(raw, max(contexts) + 1, device, dtype, args.seed)
    config = model.config
    forecast = ForecastProjections.random(config, seed=args.seed + 1).to(device=device, dtype=dtype)
    if device.type == "cuda":
        free_gpu, total_gpu = torch.cuda.mem_get_info(device)
    else:
        free_gpu, total_gpu = 1 << 62, 1 << 62
    gpu_budget = free_gpu - GPU_RESERVE
    paper_gpu_budget = None
    if args.paper_gpu_mib > 0:  # an H100's memory less what this process holds before any cache (weights, context)
        paper_gpu_budget = max(0, args.paper_gpu_mib * 2**20 - (total_gpu - free_gpu) - GPU_RESERVE)
    available = host_available_bytes(HOST_RESERVE) or 0
    cap = int(args.host_gib * GIB) if args.host_gib is not None else available
    max_cap = max(batches) if args.tiny else 1 << 30  # the tiny run's "max" stays small
    offloaded = [m for m in modes if DECODE_MODES[m].offload]
    plan = set(batches)
    if want_max:
        for ctx in contexts:
            for m in offloaded:
                fp = mode_footprint(config, m, ctx, dtype, sparse)
                plan.add(min(max_batch(fp, gpu_budget, cap), max_cap))
    pinned = _pinned_size(config, sparse, dtype, contexts, sorted(plan), offloaded, cap)
    host_buffer = HostBuffer()
    t0 = time.perf_counter()
    host = _pin(host_buffer, max(pinned, GIB // 2 if not args.tiny else 1 << 20))
    res.summary["pinned_gib"], res.summary["pin_seconds"] = host.numel() / GIB, time.perf_counter() - t0
    print(f"pinned {host.numel() / GIB:.1f} GiB of host memory in {res.summary['pin_seconds']:.1f} s", flush=True)
    use_kernel = resolve_use_kernel(None, device)  # the tiny CPU run uses the torch references, like the model
    setting = dict(
        model=model, config=config, sparse=sparse, device=device, dtype=dtype, args=args, forecast=forecast,
        host_buffer=host_buffer, gpu_budget=gpu_budget, host_budget=host.numel(), paper_gpu_budget=paper_gpu_budget,
        graphs=device.type == "cuda" and not args.eager, host_cap=max(cap, host.numel()), selections=selections,
        processes=processes, max_batch_cap=max_cap, t0=t_start,
    )  # fmt: skip
    paper_gib = paper_gpu_budget / GIB if paper_gpu_budget is not None else None
    res.summary.update(
        gpu_budget_gib=gpu_budget / GIB, host_budget_gib=host.numel() / GIB, paper_gpu_budget_gib=paper_gib
    )

    rows = 32 if args.tiny else 8192
    for r in copy_microbench(host, device, _ints(args.cta_quotas) + [132], args.seed, rows, use_kernel):
        res.add(**r)
    check_ctx = max(sparse.dense_len + 4 * sparse.block_size, 3 * sparse.window) if not args.tiny else 200
    checks = correctness_checks(setting, check_ctx)
    copies_exact = all(r["bit_exact"] for r in res.rows if r.get("kind") == "copy")
    checks_ok = copies_exact and all(v for k, v in checks.items() if k.endswith("_equal"))
    res.add(kind="checks", **checks, copies_bit_exact=copies_exact)
    print("checks:", checks, "copies bit-exact:", copies_exact, flush=True)
    out = Path(args.out)

    def checkpoint() -> BenchmarkResult:
        """The results so far with their projections and summary, saved (a later time-out keeps them)."""
        snap = BenchmarkResult(NAME, rows=[dict(r) for r in res.rows], summary=dict(res.summary),
                               notes=list(res.notes), environment=res.environment)  # fmt: skip
        proj = projections(snap, setting)
        model_rows = locality_model(snap, setting, max(contexts))
        _summarise(snap, proj, checks_ok, max(contexts))
        _summarise_locality(snap, model_rows, checks_ok, max(contexts))
        snap.save(out / "results")
        return snap

    try:  # a time limit's SIGINT stops the sweep; the finished cases are still summarised and saved
        _sweep(res, contexts, modes, batches, want_max, setting, checkpoint)
    except KeyboardInterrupt:
        res.summary["interrupted"] = True
        print("interrupted: saving the finished cases", flush=True)
    final = checkpoint()
    path = out / "results" / f"{NAME}.json"
    decode_rows = [r for r in final.rows if r.get("kind") == "decode"]
    print(format_table(decode_rows, ["context", "label", "selections", "batch", "status", "tokens_per_s",
                                     "ms_per_step", "bytes_per_step", "hit_rate"]))  # fmt: skip
    print(format_table([r for r in final.rows if r.get("kind") == "locality_model"],
                       ["context", "mode", "setting", "largest_batch", "peak_batch", "peak_tokens_per_s",
                        "sparse_gpu_peak_tokens_per_s", "link_ceiling_tokens_per_s"]))  # fmt: skip
    plot(final.rows, out / "plots" / f"{NAME}.png")
    plot_locality(final.rows, out / "plots" / f"{NAME}_locality.png")
    print(f"wrote {path}")
    print({k: v for k, v in final.summary.items()})
    return 0 if checks_ok else 1
