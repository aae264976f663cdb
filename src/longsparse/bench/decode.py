"""`longsparse bench decode`: decode throughput of the five KV placements of SparDA's comparison (sparda-notes §3.1,
§4.5-4.6) on one model, side by side in one process.

MiniCPM4.1-8B geometry with random bf16 weights (32 layers, hidden 4096, 32 query / 2 KV heads, d = 128, FFN 16384,
vocabulary 73448), MiniCPM4's block-sparse configuration (block 64, 1 init block, 2048-token window, top-k 64,
compression 32/16). Contexts 32K and 128K, batches 4 ... 128 as far as memory allows; every case that does not fit is
recorded as OOM (the capacity model decides before allocating; an allocator failure is caught too). Modes:
Dense† (dense attention — the split-KV decode kernel over every block since 2026-11-30, SDPA before — KV on the
GPU), Sparse† (InfLLM-V2 selection, KV on the GPU), Sparse (InfLLM-V2, KV in pinned host memory, blocks copied at
their layer), SparDA without prefetch and SparDA (Forecast selection one layer early, copies overlapped with the
previous layer). The SparDA modes use a random Forecast adapter
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

The capacity model (per-sequence GPU and host bytes of each mode, as measured here) projects each mode's largest
batch and its throughput on hosts with 1 TB and 2 TB of memory (``projection`` rows): step time is fitted as
``a + b·B`` over the measured batches and evaluated at the projected batch. These are projections, not
measurements.
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

from ..cache import BlockKVCache, CapacityError, HostBuffer, check_fits, max_batch
from ..cache.capacity import DECODE_MODES, host_available_bytes
from ..engine.cache import CompressedKeys, KVCache, allocate_compressed_keys
from ..engine.decode_graph import EagerStepper, GraphStepper
from ..engine.decode_modes import GPU_RESERVE, build_cache, mode_footprint, prepare_model
from ..models.batch import ForwardBatch
from ..models.config import decoder_config_from_hf
from ..models.forecast import ForecastProjections
from ..models.llama import LlamaForCausalLM
from ..ops._triton import resolve_use_kernel
from ..ops.sparse_attn import MINICPM4, SparseAttentionConfig, compress_keys
from ..ops.transfer import copy_rows, default_cta_quota
from . import BenchmarkResult, format_table
from .plot import panel_plot
from .timing import Clock, time_steps

NAME = "decode"
MODES = ("dense_gpu", "sparse_gpu", "sparse_offload", "sparda_noprefetch", "sparda")
GIB = 2**30
PINNABLE_FRACTION = 112 / 126
"""Share of the H200 host's memory that could be pinned (DESIGN.md §7); applied to the projected hosts too."""
PROJECTED_HOSTS = {"1TB": 1 << 40, "2TB": 2 << 40}
HOST_RESERVE = 8 * GIB

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
    parser.add_argument("--batches", default="4,8,16,32,64,128", help="comma-separated batch sizes")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated decode modes")
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
            cache.store(layer, ForwardBatch.prefill([prompt], device, slots=[s], kv_cache=cache), k, v)
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


def run_case(ctx, mode, batch, setting) -> dict:
    """One (context, mode, batch): fill, warm up, time eager steps and (on a GPU) CUDA-graph replays, sweep the CTA
    quota of SparDA cases; the row of results (``status`` "ok" or "OOM (...)")."""
    model, config, sparse, device, dtype, args = (setting[k] for k in ("model", "config", "sparse", "device",
                                                                       "dtype", "args"))  # fmt: skip
    row = dict(kind="decode", context=ctx, mode=mode, label=DECODE_MODES[mode].label, batch=batch)
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
    cache = compressed = graph = None
    try:
        before = _allocated(device)
        cache = build_cache(config, mode, batch, ctx, dtype, device, sparse, host_buffer=setting["host_buffer"],
                            check_memory=False)  # fmt: skip
        compressed = allocate_compressed_keys(model, batch, ctx)
        row["cache_gpu_bytes_per_seq"] = (_allocated(device) - before) / batch
        t0 = time.perf_counter()
        _fill(cache, compressed, config, sparse, batch, prompt, device, dtype, args.seed + ctx + batch)
        row["fill_s"] = time.perf_counter() - t0
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
        del cache, compressed, graph
        _free(device)
    return row


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
    replays: selections, tokens and logits equal."""
    model, config, sparse, device, dtype = (setting[k] for k in ("model", "config", "sparse", "device", "dtype"))
    checks = {}
    for resident, offloaded in (("sparse_gpu", "sparse_offload"), ("sparda_gpu", "sparda")):
        runs = {}
        for mode in (resident, offloaded):
            prepare_model(model, mode, sparse, forecast=setting["forecast"])
            cache = build_cache(config, mode, 2, context, dtype, device, sparse, host_buffer=setting["host_buffer"],
                                check_memory=False)  # fmt: skip
            compressed = allocate_compressed_keys(model, 2, context)
            cache.selection_log = []
            prompt = context - 2 * steps - 2
            _fill(cache, compressed, config, sparse, 2, prompt, device, dtype, seed=1234)
            with torch.inference_mode():
                stepper = EagerStepper(model, cache, compressed, torch.tensor([3, 5], device=device), [prompt] * 2,
                                       context, dense=False)  # fmt: skip
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
            del cache, compressed, stepper
            _free(device)
        (la, sa), (lb, sb) = runs[resident], runs[offloaded]
        checks[f"check_{offloaded}_selection_equal"] = len(sa) == len(sb) and all(map(torch.equal, sa, sb))
        checks[f"check_{offloaded}_tokens_equal"] = bool(torch.equal(la.argmax(-1), lb.argmax(-1)))
        checks[f"check_{offloaded}_logits_max_abs_diff"] = float((la - lb).abs().max())
    return checks


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """``(a, b)`` of step ms ≈ a + b·B (least squares; through the origin with one point)."""
    if len(points) == 1:
        b, ms = points[0]
        return 0.0, ms / b
    slope, intercept = np.polyfit([p[0] for p in points], [p[1] for p in points], 1)
    return float(max(intercept, 0.0)), float(max(slope, 1e-9))


def projections(res: BenchmarkResult, setting) -> dict:
    """Largest batch of each mode per context on this GPU (its free memory measured here) with this host's pinnable
    memory (``MemAvailable`` − 8 GiB, not just what the run pinned), 1 TB and 2 TB; projected tokens/s there from the
    fitted step time. Adds ``projection`` rows; returns {(mode, ctx, host): row}."""
    out = {}
    ok = [r for r in res.rows if r.get("kind") == "decode" and r.get("status") == "ok"]
    for ctx in sorted({r["context"] for r in ok}):
        for mode in MODES:
            pts = sorted((r["batch"], r["ms_per_step"]) for r in ok if r["mode"] == mode and r["context"] == ctx)
            if not pts:
                continue
            rows = [r for r in ok if r["mode"] == mode and r["context"] == ctx]
            fp = mode_footprint(setting["config"], mode, ctx, setting["dtype"], setting["sparse"])
            measured_cache = max(r["cache_gpu_bytes_per_seq"] for r in rows)
            workspace = max((r.get("step_workspace_bytes_per_seq") or 0) for r in rows)
            fp = replace(fp, gpu_per_seq=max(fp.gpu_per_seq, int(measured_cache)),
                         step_bytes_per_seq=max(fp.step_bytes_per_seq, int(workspace)))  # fmt: skip
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


def _sweep(res: BenchmarkResult, contexts, modes, batches, setting) -> None:
    """Every (context, mode, batch) case in order; once a batch does not fit, the larger ones of that mode are
    recorded with the same status without being run."""
    for ctx in contexts:
        for mode in modes:
            failed = None
            for batch in sorted(batches):
                if failed is not None:
                    res.add(kind="decode", context=ctx, mode=mode, label=DECODE_MODES[mode].label, batch=batch,
                            status=failed, reason="a smaller batch did not fit")  # fmt: skip
                    continue
                row = res.add(**run_case(ctx, mode, batch, setting))
                print(f"{ctx:>7} {mode:>17} B={batch:<4} {row['status']:<16} "
                      f"{row.get('tokens_per_s', float('nan')):9.1f} tok/s  hit {row.get('hit_rate', float('nan')):.3f}"
                      f"  {row.get('bytes_per_step', 0) / 1e6:8.1f} MB/step", flush=True)  # fmt: skip
                if row["status"] != "ok":
                    failed = row["status"]


def plot(rows: list[dict], path: Path) -> Path:
    """Tokens/s against batch, one panel per context, one line per mode (missing points: the batch did not fit)."""
    decode_rows = [r for r in rows if r.get("kind") == "decode"]
    batches = sorted({r["batch"] for r in decode_rows})
    modes = [m for m in MODES if any(r["mode"] == m for r in decode_rows)]
    panels = {}
    for ctx in sorted({r["context"] for r in decode_rows}):
        panels[f"{ctx // 1024}K context"] = {
            DECODE_MODES[m].label: [next((r.get("tokens_per_s") for r in decode_rows if r["mode"] == m
                                          and r["context"] == ctx and r["batch"] == b and r["status"] == "ok"), None)
                                    for b in batches]
            for m in modes
        }  # fmt: skip
    return panel_plot(path, batches, panels, title="Decode throughput (H200, MiniCPM4.1-8B geometry, random weights); "
                      "missing points: OOM", xlabel="batch", ylabel="tokens/s")  # fmt: skip


def run(args) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    contexts, batches = _ints(args.contexts), _ints(args.batches)
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise ValueError(f"--modes: unknown mode {m!r}; choose from {', '.join(MODES)}")
    if args.tiny:
        contexts, batches = [300], [2, 4]
        raw, sparse = TINY_MODEL, TINY_SPARSE
    else:
        raw, sparse = MINICPM41_8B, MINICPM4
    res = BenchmarkResult(NAME)
    res.notes.append(
        "Random weights: selections (InfLLM-V2 from random queries, Forecast from a random adapter) are those of an "
        "untrained model; the hit rate and bytes moved are therefore not those of a trained model (see BENCHMARKS.md)."
    )
    model = random_model(raw, max(contexts) + 1, device, dtype, args.seed)
    config = model.config
    forecast = ForecastProjections.random(config, seed=args.seed + 1).to(device=device, dtype=dtype)
    free_gpu = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 1 << 62
    gpu_budget = free_gpu - GPU_RESERVE
    available = host_available_bytes(HOST_RESERVE) or 0
    cap = int(args.host_gib * GIB) if args.host_gib is not None else available
    pinned = _pinned_size(config, sparse, dtype, contexts, batches, [m for m in modes if DECODE_MODES[m].offload], cap)
    host_buffer = HostBuffer()
    t0 = time.perf_counter()
    host = _pin(host_buffer, max(pinned, GIB // 2 if not args.tiny else 1 << 20))
    res.summary["pinned_gib"], res.summary["pin_seconds"] = host.numel() / GIB, time.perf_counter() - t0
    print(f"pinned {host.numel() / GIB:.1f} GiB of host memory in {res.summary['pin_seconds']:.1f} s", flush=True)
    use_kernel = resolve_use_kernel(None, device)  # the tiny CPU run uses the torch references, like the model
    setting = dict(
        model=model, config=config, sparse=sparse, device=device, dtype=dtype, args=args, forecast=forecast,
        host_buffer=host_buffer, gpu_budget=gpu_budget, host_budget=host.numel(),
        graphs=device.type == "cuda" and not args.eager, host_cap=max(cap, host.numel()),
    )  # fmt: skip
    res.summary.update(gpu_budget_gib=gpu_budget / GIB, host_budget_gib=host.numel() / GIB)

    rows = 32 if args.tiny else 8192
    for r in copy_microbench(host, device, _ints(args.cta_quotas) + [132], args.seed, rows, use_kernel):
        res.add(**r)
    check_ctx = max(sparse.dense_len + 4 * sparse.block_size, 3 * sparse.window) if not args.tiny else 200
    checks = correctness_checks(setting, check_ctx)
    copies_exact = all(r["bit_exact"] for r in res.rows if r.get("kind") == "copy")
    checks_ok = copies_exact and all(v for k, v in checks.items() if k.endswith("_equal"))
    res.add(kind="checks", **checks, copies_bit_exact=copies_exact)
    print("checks:", checks, "copies bit-exact:", copies_exact, flush=True)

    try:  # a time limit's SIGINT stops the sweep; the finished cases are still summarised and saved
        _sweep(res, contexts, modes, batches, setting)
    except KeyboardInterrupt:
        res.summary["interrupted"] = True
        print("interrupted: saving the finished cases", flush=True)
    proj = projections(res, setting)
    _summarise(res, proj, checks_ok, max(contexts))
    out = Path(args.out)
    path = res.save(out / "results")
    decode_rows = [r for r in res.rows if r.get("kind") == "decode"]
    print(format_table(decode_rows, ["context", "label", "batch", "status", "tokens_per_s", "ms_per_step",
                                     "bytes_per_step", "hit_rate"]))  # fmt: skip
    print(format_table([r for r in res.rows if r.get("kind") == "projection"],
                       ["context", "mode", "host", "largest_batch", "projected_tokens_per_s"]))  # fmt: skip
    plot(res.rows, out / "plots" / f"{NAME}.png")
    print(f"wrote {path}")
    print({k: v for k, v in res.summary.items()})
    return 0 if checks_ok else 1
