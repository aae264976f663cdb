"""`longsparse bench model`: whole-model prefill and decode at real geometries, against Hugging Face transformers.

One model per geometry (:mod:`longsparse.bench.geometry`: Qwen3.5-4B, Qwen3.5-9B, MiniCPM4.1-8B shapes with random
bf16 weights, or ``--model PATH``), built once by transformers and loaded into ours with the same weights; every row
is measured in the same process. Modes:

* ``hf`` — transformers' own model (dense; its GDN layers run FLA's kernels when ``fla`` imports — how users run
  Qwen3.5 today — else its torch fallback; ``hf_gdn_kernel`` says which), SDPA attention;
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
own cache (copied with its public ``reorder_cache``), both eager, host-synchronised every step; the first step's
logits (first batch size) are checked across modes like the prefill's.

Rows are written to ``<out>/results/model.json`` as soon as each one is finished (a crash or a timeout keeps the
finished rows); ``--append`` merges a run into an existing file (a row with the same geometry, phase, mode, length
and batch is replaced). A case that does not fit in memory or in ``--max-call-s`` is recorded with the reason.
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import time
import traceback
from pathlib import Path

import torch

from ..cache import CapacityError
from ..engine.cache import allocate_caches, allocate_compressed_keys
from ..engine.decode_modes import build_cache
from ..engine.runner import ModelRunner
from ..models.batch import ForwardBatch
from ..models.forecast import resolve_forecast
from ..models.modes import ExecutionModes
from . import BenchmarkResult, format_table, load
from .components import COMPONENTS, breakdown, shares
from .geometry import GEOMETRIES, ModelPair, build_pair, hf_gdn_kernel, load_pair

NAME = "model"
MODES: dict[str, ExecutionModes | None] = {
    "hf": None,
    "dense": ExecutionModes(gdn="dense", attention="dense"),
    "sparse_gdn": ExecutionModes(gdn="sparse", attention="dense"),
    "sparse": ExecutionModes(gdn="sparse", attention="sparse"),
    "sparda": ExecutionModes(gdn="sparse", attention="sparda"),
}
DECODE_MODES = ("hf", "dense", "sparse", "sparda")
"""A decode step runs the GDN recurrence whatever the GDN mode, so decode compares the attention modes."""
CACHE_MODE = {"dense": "dense_gpu", "sparse": "sparse_gpu", "sparda": "sparda_gpu"}
FULL_MODE = "sparse"
"""The summary's "full longsparse configuration": SparseGDN + InfLLM-V2 attention, whose output is meaningful without
training (``sparda`` is reported beside it, but its Forecast weights here are random)."""
MEANINGFUL_MODES = ("hf", "dense", "sparse_gdn", "sparse")
"""Modes whose output means something with these weights (``sparda``'s Forecast weights are random)."""
MODE_NOTES = {
    "hf": "transformers, dense",
    "sparse": "InfLLM-V2 block-sparse attention: training-free on Qwen3.5 (not trained with it)",
    "sparda": "SparDA with RANDOM Forecast weights: speed only, block choices meaningless",
}
DENSE_MODEL_NOTES = {"sparse": "InfLLM-V2 block-sparse attention (MiniCPM4's own attention, here with random weights)"}
"""Notes that replace :data:`MODE_NOTES` on a model without GDN layers."""
DENSE_TOL = 0.05
"""Relative error allowed between ours-dense and transformers' logits: two bf16 implementations of a 32-layer model
with different operation orders (the same weights); in float32 (tiny models on the CPU) they agree to ~1e-7."""
GIB = 2**30


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--geometry",
        default="qwen3.5-4b",
        help=f"comma-separated presets: {', '.join(GEOMETRIES)} (default: %(default)s)",
    )
    parser.add_argument("--model", default=None, help="a checkpoint folder instead of --geometry (real weights)")
    parser.add_argument("--phase", choices=("prefill", "decode", "all"), default="all")
    parser.add_argument("--lengths", default="8192,32768,65536,131072", help="prefill lengths (B = 1)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
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
    parser.add_argument("--decode-steps", type=int, default=8)
    parser.add_argument("--decode-warmup", type=int, default=2)
    parser.add_argument("--check-rows", type=int, default=16, help="last rows of logits compared between modes")
    parser.add_argument("--no-breakdown", action="store_true", help="skip the instrumented component pass")
    parser.add_argument("--append", action="store_true", help="merge into an existing results file")
    parser.add_argument(
        "--report",
        action="store_true",
        help="measure nothing: redraw the plots and print the tables of the existing results file",
    )
    parser.add_argument("--name", default=NAME, help="results file name (default: %(default)s)")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--seed", type=int, default=0)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _names(text: str, allowed, what: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in allowed]
    if bad:
        raise ValueError(f"--{what}: unknown {', '.join(bad)}; choose from {', '.join(allowed)}")
    return names


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def tokens_label(T: int) -> str:
    return f"{T // 1024}K" if T % 1024 == 0 else str(T)


class RowLog:
    """The results file, rewritten after every change: rows filled in place and saved as they finish.

    With ``append`` the rows, notes and environment of an existing file are kept (its environment moves to
    ``environment["previous_runs"]``) and a new row replaces an old one with the same key."""

    KEY = ("geometry", "phase", "mode", "T", "B")

    def __init__(self, out: Path, name: str, append: bool):
        self.out = out
        self.result = BenchmarkResult(name)
        path = out / "results" / f"{name}.json"
        if append and path.exists():
            old = load(path)
            previous = old.get("environment", {})
            self.result.environment["previous_runs"] = previous.pop("previous_runs", []) + [previous]
            self.result.rows = list(old.get("rows", []))
            self.result.notes = list(old.get("notes", []))

    def note(self, text: str) -> None:
        if text not in self.result.notes:
            self.result.notes.append(text)

    def start(self, **key) -> dict:
        wanted = tuple(key.get(k) for k in self.KEY)
        self.result.rows = [r for r in self.result.rows if tuple(r.get(k) for k in self.KEY) != wanted]
        row = self.result.add(**key, run=self.result.environment["date"])
        self.save()
        return row

    def save(self) -> Path:
        self.result.summary = summarise(self.result.rows)
        return self.result.save(self.out / "results")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def _top1(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.argmax(-1) == b.argmax(-1)).double().mean().item()


def _ours_call(model, ids: torch.Tensor, rows: int, state: dict):
    """One prefill of ``ids [T]`` by our model: logits of its last ``rows`` tokens (the batch is kept in ``state``)."""

    def call():
        batch = ForwardBatch.prefill([ids.shape[0]], ids.device)
        hidden = model(ids, batch)
        state["batch"] = batch
        return model.compute_logits(hidden[-rows:])

    return call


def _hf_call(hf, ids: torch.Tensor, rows: int):
    def call():
        return hf(input_ids=ids[None], use_cache=False, logits_to_keep=rows).logits[0].float()

    return call


def _timed(fn, device: torch.device) -> tuple[float, object, float | None]:
    """(milliseconds, result, peak GiB allocated beyond what was allocated before; None off the GPU) of one call,
    the device drained before and after."""
    _sync(device)
    if device.type == "cuda":
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end), out, (torch.cuda.max_memory_allocated(device) - before) / GIB
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, out, None


def _projected_s(rows: list[dict], label: str, mode: str, T: int) -> float | None:
    """A quadratic projection (an upper bound: attention is the only quadratic part) of a ``mode`` call at ``T`` from
    the longest shorter length already measured (its median, not its warm-up call, which includes compilation)."""
    done = [r for r in rows if r.get("geometry") == label and r.get("phase") == "prefill" and r.get("mode") == mode
            and r.get("T", T) < T and r.get("ms")]  # fmt: skip
    if not done:
        return None
    r = max(done, key=lambda r: r["T"])
    return r["ms"] / 1e3 * (T / r["T"]) ** 2


class _Context:
    """What the cases of one model share: device, dtype, arguments, the random adapter, reference logits."""

    def __init__(self, pair: ModelPair, args, device, dtype, log: RowLog):
        self.pair, self.args, self.log = pair, args, log
        self.device, self.dtype = device, dtype
        self.refs: dict[tuple[object, str], torch.Tensor] = {}  # (case, mode) -> logits compared across modes
        self._forecast = None

    @property
    def hybrid(self) -> bool:
        return bool(self.pair.ours.config.gdn_layers)

    def set_mode(self, mode: str) -> None:
        modes = MODES[mode]
        forecast = None
        if modes.attention == "sparda":
            if self._forecast is None:
                self._forecast = resolve_forecast("random", self.pair.ours.config, self.dtype, self.device)
            forecast = self._forecast
        self.pair.ours.set_modes(modes, sparse_attention_config=self.pair.sparse, forecast=forecast)

    def note(self, mode: str) -> str | None:
        return (MODE_NOTES if self.hybrid else {**MODE_NOTES, **DENSE_MODEL_NOTES}).get(mode)

    def skip_reason(self, mode: str) -> str | None:
        if mode == "hf" and self.pair.hf is None:
            return f"transformers could not load the model: {self.pair.hf_error}"
        if mode == "sparse_gdn" and not self.hybrid:
            return "the model has no GDN layers"
        return None


def _prefill_case(row: dict, ctx: _Context, mode: str, ids: torch.Tensor) -> None:
    """Fill ``row`` with the latency, peak memory, checks and component split of one prefill."""
    args, device, T = ctx.args, ctx.device, ids.shape[0]
    state: dict = {}
    if mode == "hf":
        model, call = ctx.pair.hf, _hf_call(ctx.pair.hf, ids, args.check_rows)
        row["hf_gdn_kernel"] = hf_gdn_kernel(ctx.pair.hf)
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
        _free(device)
        if device.type == "cuda":
            row["allocated_before_gib"] = torch.cuda.memory_allocated(device) / GIB  # both models' weights
        warm_ms, logits, row["warmup_peak_gib"] = _timed(call, device)
        row["warmup_ms"] = warm_ms
        ctx.log.save()
        if warm_ms > args.max_call_s * 1e3:
            # one call already filled the time box: report it (compilation included) and measure nothing more
            row.update(ms=warm_ms, reps=0, tokens_per_s=T / (warm_ms / 1e3), peak_gib=row["warmup_peak_gib"],
                       timing_note="the warm-up call alone exceeded --max-call-s: ms and peak_gib are that call's, "
                                   "compilation included; no component split")  # fmt: skip
            _checks(row, ctx, mode, ("prefill", T), logits)
            return
        times: list[float] = []
        # at least one timed call; more while the case stays within its time box
        while not times or (len(times) < args.reps and sum(times) + times[-1] <= args.max_call_s * 1e3):
            ms, out, peak = _timed(call, device)
            if not times:  # after the warm-up: no compilation or autotuning buffers in the peak
                row["peak_gib"] = peak
            times.append(ms)
            del out
        row["reps"] = len(times)
        row["ms"] = statistics.median(times)
        row["ms_all"] = times
        row["tokens_per_s"] = T / (row["ms"] / 1e3)
        _checks(row, ctx, mode, ("prefill", T), logits)
        if "batch" in state:
            batch = state.pop("batch")
            if batch.gdn_keep_ratios:
                row["gdn_keep_ratio"] = sum(batch.gdn_keep_ratios) / len(batch.gdn_keep_ratios)
            row["block_fraction"] = batch.block_fractions.mean()
        if not args.no_breakdown:
            split = breakdown(model, call, device)
            row["breakdown_ms"] = {k: split[k] for k in COMPONENTS}
            row["breakdown_total_ms"] = split["total"]
            row["breakdown_share"] = shares(row["breakdown_ms"])
        state.clear()


def _checks(row: dict, ctx: _Context, mode: str, case: tuple, logits: torch.Tensor) -> None:
    """Compare ``logits`` (of ``case``: the last prefill rows, or the first decode step) with ours-dense's and, for
    ours-dense, with transformers'. The references are the modes that ran earlier in this run (hf, then dense)."""
    logits = logits.float().cpu()
    ctx.refs[(case, mode)] = logits
    row["check_finite"] = bool(torch.isfinite(logits).all())
    dense, hf = ctx.refs.get((case, "dense")), ctx.refs.get((case, "hf"))
    if mode == "dense":
        if hf is not None:
            row["check_rel_vs_hf"] = _rel(logits, hf)
            row["check_top1_vs_hf"] = _top1(logits, hf)
            row["checks_pass"] = row["check_finite"] and row["check_rel_vs_hf"] <= DENSE_TOL
        else:
            row["checks_pass"] = None
            row["check_note"] = "no transformers logits in this run to compare with"
        return
    if dense is not None:
        row["check_rel_vs_dense"] = _rel(logits, dense)
        row["check_top1_vs_dense"] = _top1(logits, dense)
    elif mode != "hf":
        row["check_note"] = "no ours-dense logits in this run to compare with"
    # the approximate modes have no threshold: their difference from dense is the measured approximation
    row["checks_pass"] = row["check_finite"]


def run_prefill(ctx: _Context, lengths: list[int], modes: list[str]) -> None:
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
                _guarded(row, ctx, lambda row=row, mode=mode, ids=ids: _prefill_case(row, ctx, mode, ids))
            print(f"prefill {ctx.pair.label} {mode} T={T}: {_brief(row)}", flush=True)
        ctx.refs.clear()


def _guarded(row: dict, ctx: _Context, fn) -> None:
    """Run ``fn``; an out-of-memory error or any other failure is written into ``row``, which is saved either way (an
    interruption is recorded too, then re-raised)."""
    try:
        fn()
    except torch.cuda.OutOfMemoryError as exc:
        row.update(error="OOM", detail=str(exc).splitlines()[0][:300])
    except CapacityError as exc:
        row.update(error="does not fit", detail=str(exc)[:300])
    except Exception as exc:  # keep measuring the other cases; the row says what failed
        traceback.print_exc()
        row.update(error=type(exc).__name__, detail=str(exc)[:500])
    except BaseException:  # a time limit's SIGINT (KeyboardInterrupt): the run stops, the row says where
        row.update(error="interrupted", detail="the run was stopped (e.g. by its time limit) during this case")
        raise
    finally:
        _free(ctx.device)
        ctx.log.save()


def _brief(row: dict) -> str:
    for key in ("skipped", "error"):
        if key in row:
            return f"{key}: {row.get('detail', row[key])}"
    if "ms" in row:
        return f"{row['ms']:.1f} ms" + (f", peak +{row['peak_gib']:.2f} GiB" if row.get("peak_gib") is not None else "")
    if "tokens_per_s" in row:
        return f"{row['tokens_per_s']:.1f} tok/s"
    return "?"


class _StepTimes:
    """A ``generate`` streamer that stamps the host time of every ``put`` (the prompt, then each new token; the
    tokens arrive on the host, so each stamp follows its step's completion)."""

    def __init__(self):
        self.stamps: list[float] = []

    def put(self, value) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


def _hf_kv_bytes(config, batch: int, context: int, dtype: torch.dtype) -> int:
    """transformers' cache for ``batch`` sequences of ``context`` tokens (KV of the attention layers)."""
    per_token = 2 * len(config.attention_layers) * config.num_key_value_heads * config.head_dim * dtype.itemsize
    return batch * context * per_token


def _fits_hf(ctx: _Context, batch: int, context: int) -> str | None:
    if ctx.device.type != "cuda":
        return None
    need = _hf_kv_bytes(ctx.pair.ours.config, batch, context, ctx.dtype) + GIB
    free, _ = torch.cuda.mem_get_info(ctx.device)
    if need > free:
        return f"transformers' KV cache needs {need / GIB:.1f} GiB, {free / GIB:.1f} GiB free"
    return None


def _hf_decode(ctx: _Context, context: int, batches: list[int]) -> None:
    hf, args, device = ctx.pair.hf, ctx.args, ctx.device
    ids = _decode_ids(ctx, context)
    prompt = context - 1
    with torch.inference_mode():
        out = hf(input_ids=ids[None, :prompt], use_cache=True, logits_to_keep=1)
        cache, first = out.past_key_values, out.logits[0, -1].argmax()
        del out
    for B in batches:
        row = ctx.log.start(geometry=ctx.pair.label, phase="decode", mode="hf", T=context, B=B)

        def case(row=row, B=B):
            reason = _fits_hf(ctx, B, context)
            if reason:
                row.update(error="does not fit", detail=reason)
                return
            cache_b = copy.deepcopy(cache)
            cache_b.reorder_cache(torch.zeros(B, dtype=torch.long, device=device))
            inputs = torch.cat([ids[:prompt], first[None]])[None].expand(B, -1)
            steps = args.decode_warmup + args.decode_steps
            clock = _StepTimes()
            check = B == batches[0]  # the first step's logits of one batch size are checked across modes
            with torch.inference_mode():
                out = hf.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs), past_key_values=cache_b,
                                  max_new_tokens=steps, min_new_tokens=steps, do_sample=False, streamer=clock,
                                  pad_token_id=0, output_logits=check, return_dict_in_generate=True)  # fmt: skip
            if check:
                _checks(row, ctx, "hf", ("decode", context), out.logits[0][0])
            del out
            # every step decoded one token over the copied cache (nothing re-prefilled): prompt + steps cached
            row["check_hf_cache_tokens_ok"] = cache_b.get_seq_length() == prompt + steps
            del cache_b
            w = args.decode_warmup  # stamps[0] is the prompt, stamps[k] follows decode step k
            seconds = clock.stamps[w + args.decode_steps] - clock.stamps[w]
            row["ms_per_step"] = seconds * 1e3 / args.decode_steps
            row["tokens_per_s"] = B * args.decode_steps / seconds

        _guarded(row, ctx, case)
        print(f"decode {ctx.pair.label} hf ctx={context} B={B}: {_brief(row)}", flush=True)


def _decode_ids(ctx: _Context, context: int) -> torch.Tensor:
    vocab = ctx.pair.ours.config.vocab_size
    gen = torch.Generator().manual_seed(ctx.args.seed + 7 * context)
    return torch.randint(0, vocab, (context,), generator=gen).to(ctx.device)


def _ours_caches(ctx: _Context, mode: str, num: int, capacity: int):
    config, model = ctx.pair.ours.config, ctx.pair.ours
    kv = build_cache(config, CACHE_MODE[mode], num, capacity, ctx.dtype, ctx.device, ctx.pair.sparse)
    _, states = allocate_caches(config, num, capacity, ctx.dtype, ctx.device, kv_cache=False)
    return kv, states, allocate_compressed_keys(model, num, capacity)


def _replicate(src, dst) -> None:
    """Copy slot 0 of the caches ``src`` (kv, GDN states, compressed keys) into every slot of ``dst``."""
    for a, b in zip(src, dst):
        if a is None:
            continue
        for name in ("keys", "values", "conv", "recurrent", "k_cmp", "ring"):
            for layer, tensor in getattr(a, name, {}).items():
                target = getattr(b, name)[layer]
                target.copy_(tensor[:1].expand_as(target))


def _ours_decode(ctx: _Context, mode: str, context: int, batches: list[int]) -> None:
    args, device = ctx.args, ctx.device
    ctx.set_mode(mode)
    model = ctx.pair.ours
    runner = ModelRunner(model)
    ids = _decode_ids(ctx, context)
    prompt = context - 1
    steps = args.decode_warmup + args.decode_steps
    capacity = context + steps
    source = kv, states, ck = _ours_caches(ctx, mode, 1, capacity)
    out = runner.prefill([ids[:prompt].tolist()], slots=[0], kv_cache=kv, gdn_states=states, compressed_keys=ck)
    first = int(out.logits[0].argmax())
    del out
    for B in batches:
        row = ctx.log.start(geometry=ctx.pair.label, phase="decode", mode=mode, T=context, B=B)
        if ctx.note(mode):
            row["note"] = ctx.note(mode)

        def case(row=row, B=B):
            kv_b, states_b, ck_b = caches = _ours_caches(ctx, mode, B, capacity)
            _replicate(source, caches)
            tokens, lengths = [first] * B, [prompt] * B
            stamps = []
            for step in range(steps):
                if step == args.decode_warmup:
                    _sync(device)
                    stamps.append(time.perf_counter())
                out = runner.decode(tokens, prefix_lens=lengths, slots=list(range(B)), kv_cache=kv_b,
                                    gdn_states=states_b, compressed_keys=ck_b)  # fmt: skip
                if step == 0 and B == batches[0]:
                    _checks(row, ctx, mode, ("decode", context), out.logits[0])
                tokens = out.logits.argmax(-1).tolist()
                lengths = [n + 1 for n in lengths]
            _sync(device)
            seconds = time.perf_counter() - stamps[0]
            row["ms_per_step"] = seconds * 1e3 / args.decode_steps
            row["tokens_per_s"] = B * args.decode_steps / seconds
            row["kv_gib"] = kv_b.nbytes().gpu / GIB

        _guarded(row, ctx, case)
        print(f"decode {ctx.pair.label} {mode} ctx={context} B={B}: {_brief(row)}", flush=True)


def run_decode(ctx: _Context, contexts: list[int], batches: list[int], modes: list[str]) -> None:
    for context in contexts:
        for mode in [m for m in DECODE_MODES if m in modes]:
            reason = ctx.skip_reason(mode)
            if reason:
                for B in batches:
                    row = ctx.log.start(geometry=ctx.pair.label, phase="decode", mode=mode, T=context, B=B)
                    row["skipped"] = reason
                ctx.log.save()
                continue
            try:
                if mode == "hf":
                    _hf_decode(ctx, context, batches)
                else:
                    _ours_decode(ctx, mode, context, batches)
            except Exception as exc:  # the prefill that fills the cache failed: every batch of it says so
                if not isinstance(exc, torch.cuda.OutOfMemoryError):
                    traceback.print_exc()
                for B in batches:
                    row = ctx.log.start(geometry=ctx.pair.label, phase="decode", mode=mode, T=context, B=B)
                    row.update(error="prefill of the decode context failed: " + type(exc).__name__,
                               detail=str(exc).splitlines()[0][:300] if str(exc) else "")  # fmt: skip
                ctx.log.save()
            _free(ctx.device)


def _pick(rows, label, phase, mode, T, B=1) -> dict | None:
    for r in rows:
        if (r.get("geometry"), r.get("phase"), r.get("mode"), r.get("T"), r.get("B")) == (label, phase, mode, T, B):
            return r
    return None


def _ok(row: dict | None) -> bool:
    return row is not None and "error" not in row and "skipped" not in row and row.get("checks_pass") is not False


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def summarise(rows: list[dict]) -> dict:
    """Headline figures (the issue's keys, for Qwen3.5-4B) and, per geometry and length, every mode's speedup.

    A speedup is reported only if both rows ran, ours-dense agreed with transformers in that phase at that length
    (its ``checks_pass``: prefill logits, or the first decode step's) and the mode's own checks passed; ``None``
    otherwise."""
    summary: dict = {"prefill": {}, "decode": {}}
    labels = sorted({r.get("geometry") for r in rows if r.get("geometry")})
    for label in labels:
        per = summary["prefill"].setdefault(label, {})
        for T in sorted({r["T"] for r in rows if r.get("geometry") == label and r.get("phase") == "prefill"}):
            dense = _pick(rows, label, "prefill", "dense", T)
            hf = _pick(rows, label, "prefill", "hf", T)
            trusted = _ok(dense) and dense.get("checks_pass") is True
            entry = per.setdefault(tokens_label(T), {})
            for mode in MODES:
                r = _pick(rows, label, "prefill", mode, T)
                if not _ok(r) or "ms" not in r:
                    continue
                e = entry[mode] = {"ms": r["ms"], "peak_gib": r.get("peak_gib")}
                if "check_rel_vs_dense" in r:
                    e["rel_vs_dense"] = r["check_rel_vs_dense"]
                if trusted and mode != "hf":
                    e["speedup_vs_hf"] = _ratio(hf.get("ms"), r["ms"]) if _ok(hf) else None
                    e["speedup_vs_dense"] = _ratio(dense["ms"], r["ms"])
            usable = {m: e["ms"] for m, e in entry.items() if m in MEANINGFUL_MODES}
            if usable:
                entry["fastest_meaningful"] = min(usable, key=usable.get)
        dec = summary["decode"].setdefault(label, {})
        for r in rows:
            if r.get("geometry") == label and r.get("phase") == "decode" and _ok(r) and "tokens_per_s" in r:
                hf = _pick(rows, label, "decode", "hf", r["T"], r["B"])
                trusted = any(d.get("checks_pass") is True for d in rows if (d.get("geometry"), d.get("phase"),
                              d.get("mode"), d.get("T")) == (label, "decode", "dense", r["T"]))  # fmt: skip
                key = f"{tokens_label(r['T'])}_b{r['B']}"
                dec.setdefault(key, {})[r["mode"]] = {
                    "tokens_per_s": r["tokens_per_s"],
                    "speedup_vs_hf": (
                        _ratio(r["tokens_per_s"], hf.get("tokens_per_s")) if _ok(hf) and trusted else None
                    ),
                }
    four = summary["prefill"].get("qwen3.5-4b", {}).get("128K", {})
    full = four.get(FULL_MODE, {})
    summary["prefill_speedup_vs_hf_128k_qwen35_4b"] = full.get("speedup_vs_hf")
    summary["prefill_speedup_vs_own_dense_128k_qwen35_4b"] = full.get("speedup_vs_dense")
    summary["prefill_speedup_vs_hf_128k_qwen35_4b_sparda"] = four.get("sparda", {}).get("speedup_vs_hf")
    dense = _pick(rows, "qwen3.5-4b", "prefill", "dense", 131072)
    share = dense.get("breakdown_share") if _ok(dense) else None
    summary["gdn_share_of_prefill_128k_dense"] = share.get("gdn_core") if share else None
    summary["attn_share_of_prefill_128k_dense"] = share.get("attention") if share else None
    hf_row = _pick(rows, "qwen3.5-4b", "prefill", "hf", 131072)
    hf_share = hf_row.get("breakdown_share") if _ok(hf_row) else None
    summary["gdn_share_of_prefill_128k_hf"] = hf_share.get("gdn_core") if hf_share else None
    summary["attn_share_of_prefill_128k_hf"] = hf_share.get("attention") if hf_share else None
    b16 = summary["decode"].get("qwen3.5-4b", {}).get("32K_b16", {})
    summary["decode_speedup_vs_hf_b16_32k_qwen35_4b"] = b16.get(FULL_MODE, {}).get("speedup_vs_hf")
    summary["full_mode"] = FULL_MODE
    summary["targets"] = {"prefill_speedup_vs_hf_128k_qwen35_4b": 2.0, "decode_speedup_vs_hf_b16_32k_qwen35_4b": 2.0}
    return summary


def plots(rows: list[dict], out: Path) -> list[Path]:
    """Per geometry: the component split of every prefill (stacked bars per length and mode) and decode tokens/s
    against the batch size (one panel per context)."""
    from .plot import panel_plot, stacked_bars

    paths = []
    for label in sorted({r.get("geometry") for r in rows if r.get("geometry")}):
        slug = label.replace(".", "").replace("-", "_").replace(":", "_").replace("/", "_")
        pre = sorted((r for r in rows if r.get("geometry") == label and r.get("phase") == "prefill"
                      and "breakdown_ms" in r), key=lambda r: (r["T"], list(MODES).index(r["mode"])))  # fmt: skip
        if pre:
            groups = [f"{tokens_label(r['T'])} {r['mode']}" for r in pre]
            parts = {c: [r["breakdown_ms"][c] / 1e3 for r in pre] for c in COMPONENTS}
            paths.append(stacked_bars(out / "plots" / f"{NAME}_{slug}.png", groups, parts,
                                      title=f"Prefill time by component, {label}, B=1 (s)", ylabel="s"))  # fmt: skip
        dec = [r for r in rows if r.get("geometry") == label and r.get("phase") == "decode" and "tokens_per_s" in r]
        if dec:
            batches = sorted({r["B"] for r in dec})
            panels = {}
            for T in sorted({r["T"] for r in dec}):
                panels[f"context {tokens_label(T)}"] = {
                    mode: [(_pick(dec, label, "decode", mode, T, B) or {}).get("tokens_per_s") for B in batches]
                    for mode in DECODE_MODES
                }
            paths.append(panel_plot(out / "plots" / f"{NAME}_decode_{slug}.png", batches, panels,
                                    title=f"Decode throughput, {label} (eager steps)", xlabel="batch",
                                    ylabel="tokens/s"))  # fmt: skip
    return paths


NOTES = [
    "one process, one device; random weights built by transformers (seeded) and loaded into ours: the same model",
    "MiniCPM4.1-8B shapes run as a Llama-architecture model (transformers has no MiniCPM class; its scalings and "
    "LongRoPE are elementwise)",
    "modes: hf = transformers (FLA kernels for GDN when importable: hf_gdn_kernel), dense = ours dense, "
    "sparse_gdn = SparseGDN + dense attention, sparse = SparseGDN + InfLLM-V2 block-sparse attention (training-free "
    "on Qwen3.5), sparda = SparseGDN + SparDA with RANDOM Forecast weights (speed only)",
    "ours-dense's GDN core is longsparse.models.gdn.DenseGDN (the torch chunked reference), not a fused kernel",
    "prefill: B=1, median of reps after a warm-up call; peak_gib = peak allocation of the first timed call beyond "
    f"the weights; checks on the last check-rows logits: dense vs transformers within {DENSE_TOL} relative error, "
    "other modes' difference from dense recorded (approximations: no threshold)",
    "breakdown: one instrumented pass (forward hooks + CUDA events), components as in longsparse.bench.components",
    "decode: one prefill of context-1 tokens copied to every sequence; eager greedy steps, host-synchronised; "
    "transformers through generate with its cache (reorder_cache copies), ours through ModelRunner.decode",
    "summary: full configuration = sparse (SparseGDN + InfLLM-V2); a speedup is reported only when ours-dense "
    "matched transformers in the same run",
]


def report(rows: list[dict], summary: dict, paths: list[Path]) -> None:
    """Print the prefill and decode tables, the headline figures and the written files."""
    print(format_table([r for r in rows if r.get("phase") == "prefill"],
                       ["geometry", "mode", "T", "ms", "peak_gib", "check_rel_vs_dense", "check_rel_vs_hf",
                        "checks_pass", "error", "skipped"]))  # fmt: skip
    print(format_table([r for r in rows if r.get("phase") == "decode"],
                       ["geometry", "mode", "T", "B", "tokens_per_s", "ms_per_step", "error", "skipped"]))  # fmt: skip
    print({k: v for k, v in summary.items() if k not in ("prefill", "decode", "targets")})
    print("wrote " + ", ".join(str(p) for p in paths))


def run(args) -> int:
    out = Path(args.out)
    if args.report:
        data = load(out / "results" / f"{args.name}.json")
        report(data["rows"], summarise(data["rows"]), plots(data["rows"], out))
        return 0
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    modes = _names(args.modes, MODES, "modes")
    if args.decode_warmup < 1 or args.decode_steps < 1:
        raise ValueError("--decode-warmup and --decode-steps must be >= 1 (the first step is checked, untimed)")
    geometries = [] if args.model else _names(args.geometry, GEOMETRIES, "geometry")
    log = RowLog(out, args.name, args.append)
    for note in NOTES:
        log.note(note)
    log.note(f"dtype {dtype}")
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
        ctx = _Context(pair, args, device, dtype, log)
        if args.phase in ("prefill", "all"):
            run_prefill(ctx, _ints(args.lengths), modes)
        if args.phase in ("decode", "all"):
            run_decode(ctx, _ints(args.contexts), _ints(args.batches), modes)
        del ctx, pair
        _free(device)
    path = log.save()
    report(log.result.rows, log.result.summary, [path, *plots(log.result.rows, out)])
    return 0
