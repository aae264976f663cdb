"""`longsparse bench model`: whole-model prefill and decode at real geometries, against Hugging Face transformers.

One model per geometry (:mod:`longsparse.bench.geometry`: Qwen3.5-4B, Qwen3.5-9B, MiniCPM4.1-8B shapes with random
bf16 weights, or ``--model PATH``), built once by transformers and loaded into ours with the same weights; every row
is measured in the same process. Modes:

* ``hf`` — transformers' own model (dense; its GDN layers run FLA's kernels when ``fla`` imports — how users run
  Qwen3.5 — else its torch fallback; ``hf_gdn_kernel`` says which; its short convolution Dao's
  ``causal-conv1d`` kernels when that package imports, else a torch ``conv1d``: ``hf_conv_kernel``), SDPA attention;
* ``hf_compiled`` (decode only) — the same model decoding through its fast path: ``generate`` over a
  ``StaticCache``, whose decode step transformers compiles with ``torch.compile`` (mode "reduce-overhead");
* ``dense`` — ours, dense GDN core and dense SDPA attention;
* ``sparse_gdn`` — SparseGDN on the GDN layers, dense attention (hybrid models only);
* ``sparse`` — SparseGDN plus InfLLM-V2 block-sparse attention (training-free on Qwen3.5: it was not trained with
  block-sparse attention);
* ``sparda`` — SparseGDN plus SparDA's Forecast selection with RANDOM Forecast weights: a speed measurement only (the
  block choices carry no information).

Prefill (``--lengths``, B = 1): median latency over ``--reps`` calls after a warm-up call, the peak memory the call
allocates beyond the weights, the last ``--check-rows`` rows of logits compared with ours-dense (and ours-dense with
transformers': relative error within ``DENSE_TOL``), and one instrumented pass split into components
(:mod:`longsparse.bench.components`). Decode (``--contexts`` × ``--batches``): one prefill of ``context − 1`` tokens,
its caches copied to every sequence of the batch, then ``--decode-warmup`` untimed and ``--decode-steps`` timed
greedy steps: ours through :class:`~longsparse.engine.ModelRunner`, transformers through ``generate`` with its
own cache (copied with its public ``reorder_cache``), both eager, host-synchronised every step, and transformers
again over a ``StaticCache`` with its compiled decode step (``hf_compiled``); the first step's logits (first batch
size) are checked across modes like the prefill's, and the compiled decode's first compiled step against the eager
one's.

Rows are written to ``<out>/results/model.json`` as soon as each one is finished (a crash or a timeout keeps the
finished rows); ``--append`` merges a run into an existing file (a row with the same geometry, phase, mode, length
and batch is replaced). A case that does not fit in memory or in ``--max-call-s`` is recorded with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import statistics
import traceback
from pathlib import Path

import torch

from ..models.batch import ForwardBatch
from ..models.gdn import DenseGDN
from ..reports.results import RowLog, load
from .components import COMPONENTS, breakdown, shares
from .geometry import GEOMETRIES, build_pair, hf_gdn_kernel, load_pair
from .model_cases import (
    DENSE_TOL,
    FP32_FACTOR,
    GIB,
    HF_COMPILED,
    MODES,
    ROW_KEY,
    Context,
    brief,
    check_logits,
    free_memory,
    guarded,
    rel_err,
    timed_call,
    top1_agreement,
)
from .model_decode import run_decode
from .model_summary import plots, report, summarise

NAME = "model"
FP32_CHECK_LEN = 8192
"""Tokens of the float32 check a bf16 run makes by default (~20-40 s at these model sizes on the H200)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--geometry",
        default="qwen3.5-4b",
        help=f"comma-separated presets: {', '.join(GEOMETRIES)} (default: %(default)s)",
    )
    parser.add_argument("--model", default=None, help="a checkpoint folder instead of --geometry (real weights)")
    parser.add_argument("--phase", choices=("prefill", "decode", "all"), default="all")
    parser.add_argument("--lengths", default="8192,32768,65536,131072", help="prefill lengths (B = 1)")
    parser.add_argument(
        "--modes",
        default=",".join([*MODES, HF_COMPILED]),
        help=f"comma-separated, of {', '.join([*MODES, HF_COMPILED])} ({HF_COMPILED}: decode only)",
    )
    parser.add_argument("--contexts", default="32768,131072", help="decode context lengths")
    parser.add_argument("--batches", default="1,4,16,64", help="decode batch sizes")
    parser.add_argument("--reps", type=int, default=3, help="timed prefill calls per case (after one warm-up)")
    parser.add_argument(
        "--max-call-s",
        type=float,
        default=90.0,
        help="time box per prefill case: fewer reps when a call is slow; a case whose projected "
        "call time exceeds it is recorded as skipped (default: %(default)s)",
    )
    parser.add_argument(
        "--hf-conv-note",
        default=None,
        help="why transformers runs without causal-conv1d on this machine (recorded in its rows when the package "
        "does not import)",
    )
    parser.add_argument("--decode-steps", type=int, default=8)
    parser.add_argument("--decode-warmup", type=int, default=2)
    parser.add_argument("--check-rows", type=int, default=16, help="last rows of logits compared between modes")
    parser.add_argument(
        "--fp32-check-len",
        type=int,
        default=None,
        help="before the timed cases, compare ours-dense and transformers (both in the run's dtype) with transformers "
        f"in float32 at this many tokens (a row of phase fp32_check; default {FP32_CHECK_LEN} in a bf16 run, off in a "
        "float32 one; 0: off)",
    )
    parser.add_argument("--no-breakdown", action="store_true", help="skip the instrumented component pass")
    parser.add_argument(
        "--decode-first",
        action="store_true",
        help="with --phase all, measure decode before prefill (for a time-boxed run whose decode rows matter more)",
    )
    parser.add_argument("--append", action="store_true", help="merge into an existing results file")
    parser.add_argument(
        "--report",
        action="store_true",
        help="measure nothing: redraw the plots and print the tables of the existing results file",
    )
    parser.add_argument("--name", default=NAME, help="results file name (default: %(default)s)")
    parser.add_argument(
        "--tile-tokens",
        type=int,
        default=None,
        help="query tokens per block-sparse prefill tile (SparseAttentionConfig.tile_tokens; default: by group size)."
        " Rows do not record it in their key: give such a run its own --name",
    )
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--seed", type=int, default=0)


def _ints(text: str, what: str, low: int) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if any(v < low for v in values):
        raise ValueError(f"--{what} must hold integers >= {low}, got {text!r}")
    return values


def _names(text: str, allowed, what: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in allowed]
    if bad:
        raise ValueError(f"--{what}: unknown {', '.join(bad)}; choose from {', '.join(allowed)}")
    return names


def _ours_call(model, ids: torch.Tensor, rows: int, state: dict):
    """One prefill of ``ids [T]`` by our model: logits of its last ``rows`` tokens (the step's statistics are kept in
    ``state``)."""

    def call():
        batch = ForwardBatch.prefill([ids.shape[0]], ids.device)
        plan = model.plan_step(batch)
        hidden = model(ids, batch, plan)
        state["stats"] = plan.stats
        return model.compute_logits(hidden[-rows:])

    return call


def _hf_call(hf, ids: torch.Tensor, rows: int):
    def call():
        return hf(input_ids=ids[None], use_cache=False, logits_to_keep=rows).logits[0].float()

    return call


def _projected_s(rows: list[dict], label: str, mode: str, T: int) -> float | None:
    """A quadratic projection (an upper bound: attention is the only quadratic part) of a ``mode`` call at ``T`` from
    the longest shorter length already measured (its median, not its warm-up call, which includes compilation)."""
    done = [r for r in rows if r.get("geometry") == label and r.get("phase") == "prefill" and r.get("mode") == mode
            and r.get("T", T) < T and r.get("ms")]  # fmt: skip
    if not done:
        return None
    r = max(done, key=lambda r: r["T"])
    return r["ms"] / 1e3 * (T / r["T"]) ** 2


def _dense_gdn_kernels(model) -> str | None:
    """Which kernels the model's dense GDN cores ran on their last call ("fla", "torch"), or None if none did."""
    cores = (getattr(m, "core", None) for m in model.modules())
    return ",".join(sorted({c.last_kernel for c in cores if isinstance(c, DenseGDN) and c.last_kernel})) or None


def _prefill_case(row: dict, ctx: Context, mode: str, ids: torch.Tensor) -> None:
    """Fill ``row`` with the latency, peak memory, checks and component split of one prefill."""
    args, device, T = ctx.args, ctx.device, ids.shape[0]
    state: dict = {}
    if mode == "hf":
        model, call = ctx.pair.hf, _hf_call(ctx.pair.hf, ids, args.check_rows)
        row["hf_gdn_kernel"] = hf_gdn_kernel(ctx.pair.hf)
        if row["hf_gdn_kernel"] is not None:  # its short convolution: Dao's package if installed, else torch
            row["hf_conv_kernel"] = "causal_conv1d" if importlib.util.find_spec("causal_conv1d") else "torch fallback"
            if row["hf_conv_kernel"] != "causal_conv1d":
                row["hf_conv_note"] = args.hf_conv_note or "causal-conv1d is not installed"
    else:
        ctx.set_mode(mode)
        model, call = ctx.pair.ours, _ours_call(ctx.pair.ours, ids, args.check_rows, state)
        row["attention_label"] = ctx.pair.ours.attention_label
    projected = _projected_s(ctx.log.result.rows, ctx.pair.label, mode, T)
    if projected is not None and projected > args.max_call_s:
        row["skipped"] = (f"projected call time {projected:.0f} s (quadratic from the shorter length) exceeds "
                          f"--max-call-s {args.max_call_s:.0f}")  # fmt: skip
        return
    with torch.inference_mode():
        free_memory(device)
        if device.type == "cuda":
            row["allocated_before_gib"] = torch.cuda.memory_allocated(device) / GIB  # both models' weights
        warm_ms, logits, row["warmup_peak_gib"] = timed_call(call, device)
        row["warmup_ms"] = warm_ms
        if mode != "hf":
            row["dense_gdn_kernel"] = _dense_gdn_kernels(model)
        ctx.log.save()
        if warm_ms > args.max_call_s * 1e3:
            # one call already filled the time box: report it (compilation included) and measure nothing more
            row.update(ms=warm_ms, reps=0, tokens_per_s=T / (warm_ms / 1e3), peak_gib=row["warmup_peak_gib"],
                       timing_note="the warm-up call alone exceeded --max-call-s: ms and peak_gib are that call's, "
                                   "compilation included; no component split")  # fmt: skip
            check_logits(row, ctx, mode, ("prefill", T), logits)
            return
        times: list[float] = []
        # at least one timed call; more while the case stays within its time box
        while not times or (len(times) < args.reps and sum(times) + times[-1] <= args.max_call_s * 1e3):
            ms, out, peak = timed_call(call, device)
            if not times:  # after the warm-up: no compilation or autotuning buffers in the peak
                row["peak_gib"] = peak
            times.append(ms)
            del out
        row["reps"] = len(times)
        row["ms"] = statistics.median(times)
        row["ms_all"] = times
        row["tokens_per_s"] = T / (row["ms"] / 1e3)
        check_logits(row, ctx, mode, ("prefill", T), logits)
        if "stats" in state:
            stats = state.pop("stats")
            if ratios := stats.keep_ratio_values():
                row["gdn_keep_ratio"] = sum(ratios) / len(ratios)
            row["block_fraction"] = stats.block_fractions.mean()
        if not args.no_breakdown:
            split = breakdown(model, call, device)
            row["breakdown_ms"] = {k: split[k] for k in COMPONENTS}
            row["breakdown_total_ms"] = split["total"]
            if "gdn_kernel" in split:
                row["breakdown_gdn_kernel_ms"] = split["gdn_kernel"]
            row["breakdown_share"] = shares(row["breakdown_ms"])
        state.clear()


@contextlib.contextmanager
def _in_float32(model: torch.nn.Module):
    """``model``'s floating parameters and buffers in float32 inside the block, back in their own dtypes after it
    (exact: a bf16 value survives the round trip); no second copy of the model is kept."""
    dtypes = {n: t.dtype for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_floating_point()}
    model.float()
    try:
        yield model
    finally:
        for n, t in (*model.named_parameters(), *model.named_buffers()):
            if n in dtypes:
                t.data = t.data.to(dtypes[n])


def _fp32_case(row: dict, ctx: Context, ids: torch.Tensor) -> None:
    rows, hf = ctx.args.check_rows, ctx.pair.hf
    ctx.set_mode("dense")
    with torch.inference_mode():
        hf_low = _hf_call(hf, ids, rows)().float().cpu()
        ours = _ours_call(ctx.pair.ours, ids, rows, {})().float().cpu()
        free_memory(ctx.device)
        with _in_float32(hf):
            truth = _hf_call(hf, ids, rows)().float().cpu()
    row["hf_rel_vs_fp32"] = rel_err(hf_low, truth)
    row["check_rel_vs_fp32"] = rel_err(ours, truth)
    row["check_rel_vs_hf"] = rel_err(ours, hf_low)
    row["check_top1_vs_fp32"] = top1_agreement(ours, truth)
    row["hf_top1_vs_fp32"] = top1_agreement(hf_low, truth)
    row["check_factor"] = FP32_FACTOR
    row["checks_pass"] = (
        bool(torch.isfinite(ours).all()) and row["check_rel_vs_fp32"] <= FP32_FACTOR * row["hf_rel_vs_fp32"]
    )


def run_fp32_check(ctx: Context, T: int) -> None:
    """One row (phase ``fp32_check``, mode ``dense``): at ``T`` tokens, how far ours-dense and transformers, both in
    the run's dtype, are from transformers' own float32 forward pass over the same tokens (the same weights, upcast in
    place). Passes when ours is within :data:`FP32_FACTOR` of transformers' own error: ours is as accurate a bf16
    model as the one users run."""
    row = ctx.log.start(geometry=ctx.pair.label, phase="fp32_check", mode="dense", T=T, B=1)
    if ctx.pair.hf is None:
        row["skipped"] = f"transformers could not load the model: {ctx.pair.hf_error}"
    elif ctx.dtype == torch.float32:
        row["skipped"] = "the run is in float32 already"
    else:
        vocab = ctx.pair.ours.config.vocab_size
        ids = torch.randint(0, vocab, (T,), generator=torch.Generator().manual_seed(ctx.args.seed + T + 1))
        guarded(row, ctx, lambda: _fp32_case(row, ctx, ids.to(ctx.device)))
    print(
        f"fp32 check {ctx.pair.label} T={T}: "
        + (
            brief(row)
            if "check_rel_vs_fp32" not in row
            else f"ours {row['check_rel_vs_fp32']:.4f}, transformers {row['hf_rel_vs_fp32']:.4f} from float32"
        ),
        flush=True,
    )
    ctx.log.save()


def run_prefill(ctx: Context, lengths: list[int], modes: list[str]) -> None:
    order = [m for m in MODES if m in modes]  # hf and dense first: the references of the checks
    vocab = ctx.pair.ours.config.vocab_size
    for T in lengths:
        ids = torch.randint(0, vocab, (T,), generator=torch.Generator().manual_seed(ctx.args.seed + T))
        ids = ids.to(ctx.device)
        for mode in order:
            row = ctx.log.start(geometry=ctx.pair.label, phase="prefill", mode=mode, T=T, B=1)
            if ctx.note(mode):
                row["note"] = ctx.note(mode)
            reason = ctx.skip_reason(mode)
            if reason:
                row["skipped"] = reason
            else:
                guarded(row, ctx, lambda row=row, mode=mode, ids=ids: _prefill_case(row, ctx, mode, ids))
            print(f"prefill {ctx.pair.label} {mode} T={T}: {brief(row)}", flush=True)
        ctx.refs.clear()


NOTES = [
    "one process, one device; random weights built by transformers (seeded) and loaded into ours: the same model",
    "MiniCPM4.1-8B shapes run as a Llama-architecture model (transformers has no MiniCPM class; its scalings and "
    "LongRoPE are elementwise)",
    "modes: hf = transformers (FLA kernels for GDN when importable: hf_gdn_kernel), dense = ours dense, "
    "sparse_gdn = SparseGDN + dense attention, sparse = SparseGDN + InfLLM-V2 block-sparse attention (training-free "
    "on Qwen3.5), sparda = SparseGDN + SparDA with RANDOM Forecast weights (speed only)",
    "ours-dense's GDN core is longsparse.models.gdn.DenseGDN: FLA's chunk_gated_delta_rule when fla imports, else "
    "the torch chunked reference (dense_gdn_kernel)",
    "prefill: B=1, median of reps after a warm-up call; peak_gib = peak allocation of the first timed call beyond "
    f"the weights; checks on the last check-rows logits: dense vs transformers within {DENSE_TOL} relative error, "
    "other modes' difference from dense recorded (approximations: no threshold)",
    "breakdown: one instrumented pass (forward hooks + CUDA events), components as in longsparse.bench.components",
    "decode: one prefill of context-1 tokens copied to every sequence; eager greedy steps, host-synchronised; "
    "transformers through generate with its cache (reorder_cache copies), ours through ModelRunner.decode (eager_*) "
    "and, on a GPU, the same step captured as a CUDA graph (graph_*, reported as tokens_per_s)",
    "summary: full configuration = sparse (SparseGDN + InfLLM-V2); a speedup is reported only when ours-dense "
    "matched transformers in the same run",
]


def run(args) -> int:
    out = Path(args.out)
    if args.report:
        data = load(out / "results" / f"{args.name}.json")
        report(data["rows"], summarise(data["rows"]), plots(data["rows"], out, args.name))
        return 0
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    modes = _names(args.modes, [*MODES, HF_COMPILED], "modes")
    if args.fp32_check_len is None:
        args.fp32_check_len = FP32_CHECK_LEN if dtype != torch.float32 else 0
    if args.fp32_check_len < 0:
        raise ValueError(f"--fp32-check-len must be >= 0, got {args.fp32_check_len}")
    if args.decode_warmup < 1 or args.decode_steps < 1:
        raise ValueError("--decode-warmup and --decode-steps must be >= 1 (the first step is checked, untimed)")
    if args.tile_tokens is not None:  # checked against every geometry's block size before anything is built
        for g in [] if args.model else _names(args.geometry, GEOMETRIES, "geometry"):
            dataclasses.replace(GEOMETRIES[g].sparse, tile_tokens=args.tile_tokens)
    geometries = [] if args.model else _names(args.geometry, GEOMETRIES, "geometry")
    lengths, contexts = _ints(args.lengths, "lengths", 1), _ints(args.contexts, "contexts", 2)
    batches = _ints(args.batches, "batches", 1)
    log = RowLog(out / "results", args.name, ROW_KEY, summarise, append=args.append)
    for note in NOTES:
        log.note(note)
    log.note(f"dtype {dtype}")
    if args.tile_tokens is not None:
        log.note(f"block-sparse prefill tiles of {args.tile_tokens} query tokens (SparseAttentionConfig.tile_tokens)")
    sources = [("model", args.model)] if args.model else [("geometry", g) for g in geometries]
    for kind, name in sources:
        geometry = GEOMETRIES[name] if kind == "geometry" else None
        try:
            if geometry is not None:
                pair = build_pair(geometry, device, dtype, args.seed)
            else:
                pair = load_pair(name, device, dtype, GEOMETRIES["minicpm4.1-8b"].sparse)
        except Exception as exc:  # recorded: every requested case of this model is missing for this reason
            traceback.print_exc()
            row = log.start(geometry=name if geometry else f"model:{name}", phase="build", mode=None, T=None, B=None)
            row.update(error=type(exc).__name__, detail=str(exc)[:500])
            log.save()
            continue
        if args.tile_tokens is not None:
            pair = dataclasses.replace(pair, sparse=dataclasses.replace(pair.sparse, tile_tokens=args.tile_tokens))
        ctx = Context(pair, args, device, dtype, log)
        if args.fp32_check_len:
            run_fp32_check(ctx, args.fp32_check_len)
        for phase in ("decode", "prefill") if args.decode_first else ("prefill", "decode"):
            if args.phase not in (phase, "all"):
                continue
            if phase == "prefill":
                run_prefill(ctx, lengths, modes)
            else:
                run_decode(ctx, contexts, batches, modes)
        del ctx, pair
        free_memory(device)
    path = log.save()
    report(log.result.rows, log.result.summary, [path, *plots(log.result.rows, out, args.name)])
    return 0
