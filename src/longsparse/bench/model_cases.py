"""What the cases of `longsparse bench model` share: the modes, the per-model context, timing, the logit checks and
the guard that turns a failure into a recorded row (:mod:`longsparse.bench.model` runs the prefill cases,
:mod:`longsparse.bench.model_decode` the decode cases, :mod:`longsparse.bench.model_summary` reads the rows)."""

from __future__ import annotations

import gc
import time
import traceback

import torch

from ..cache import CapacityError
from ..models.forecast import resolve_forecast
from ..models.modes import ExecutionModes
from ..reports.results import RowLog
from .geometry import ModelPair

ROW_KEY = ("geometry", "phase", "mode", "T", "B")
"""The fields that identify a case: a merged run replaces the row with the same values."""

MODES: dict[str, ExecutionModes | None] = {
    "hf": None,
    "dense": ExecutionModes(gdn="dense", attention="dense"),
    "sparse_gdn": ExecutionModes(gdn="sparse", attention="dense"),
    "sparse": ExecutionModes(gdn="sparse", attention="sparse"),
    "sparda": ExecutionModes(gdn="sparse", attention="sparda"),
}
"""The suite's modes, in the order they run (the references of the checks first): ``hf`` is transformers' model, the
others are ours with these per-layer modes."""

HF_COMPILED = "hf_compiled"
"""transformers' fast decode path, a decode-only mode: ``generate`` over its ``StaticCache``, which makes it compile
the decode step with ``torch.compile`` (its default ``CompileConfig``: mode "reduce-overhead", CUDA graphs)."""

HF_MODES = ("hf", HF_COMPILED)
"""transformers' configurations: its fastest measured one is the peer of the summary's ``_hf_best_`` keys."""

DECODE_MODES = ("hf", "dense", "sparse", "sparda", HF_COMPILED)
"""A decode step runs the GDN recurrence whatever the GDN mode, so decode compares the attention modes; transformers'
compiled decode runs last, so that its compilation (the longest part of a decode run) cannot cost the other rows."""

CACHE_MODE = {"dense": "dense_gpu", "sparse": "sparse_gpu", "sparda": "sparda_gpu"}
"""The KV cache of each of our decode modes: the GPU-resident decode modes of :mod:`longsparse.cache.capacity`."""

FULL_MODE = "sparse"
"""The summary's "full longsparse configuration": SparseGDN + InfLLM-V2 attention, whose output is meaningful without
training (``sparda`` is reported beside it, but its Forecast weights here are random)."""

MEANINGFUL_MODES = ("hf", "dense", "sparse_gdn", "sparse")
"""Modes whose output means something with these weights (``sparda``'s Forecast weights are random)."""

MODE_NOTES = {
    "hf": "transformers, dense",
    HF_COMPILED: "transformers, dense: generate over a StaticCache, its decode step compiled (torch.compile)",
    "sparse": "InfLLM-V2 block-sparse attention: training-free on Qwen3.5 (not trained with it)",
    "sparda": "SparDA with RANDOM Forecast weights: speed only, block choices meaningless",
}

DENSE_MODEL_NOTES = {"sparse": "InfLLM-V2 block-sparse attention (MiniCPM4's own attention, here with random weights)"}
"""Notes that replace :data:`MODE_NOTES` on a model without GDN layers."""

DENSE_TOL = 0.1
"""Relative error allowed between ours-dense and transformers' logits: two bf16 implementations of a 32-layer model
with different operation orders (the same weights; in float32, tiny models on the CPU, they agree to ~1e-7). Measured
on the H200 at Qwen3.5-4B shapes, 8K tokens, random weights: transformers in bf16 is 0.065 from its own float32
forward, ours 0.062, and the two bf16 models 0.066 apart: each bf16 model is as far from float32 as from the other, so
the bound is about twice that distance (0.05 held only while ours ran transformers' own operation order for the short
convolution and the norms). ``--fp32-check-len`` measures the stronger property, that ours is no further from float32
than transformers (:data:`FP32_FACTOR`)."""

FP32_FACTOR = 1.25
"""The float32 check: ours-dense's relative error from transformers' float32 forward must be within this factor of
transformers' own bf16 error from it."""

DECODE_DRIFT_FACTOR = 2.0
"""A decode step's logits are computed in another order than a forward pass over the same tokens (the recurrent GDN
step against the chunked form, one query row against a tile), so in bf16 they drift further apart than two forward
passes: transformers' own first decode step is 5.8 % from its forward pass over the same tokens at Qwen3.5-4B geometry
(random weights, H200), ours 6.8 %. The decode check of ours-dense allows ``max(DENSE_TOL, factor × transformers' own
step-vs-forward drift)``, measured in the same run."""

GIB = 2**30


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def tokens_label(T: int) -> str:
    return f"{T // 1024}K" if T % 1024 == 0 else str(T)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def top1_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.argmax(-1) == b.argmax(-1)).double().mean().item()


def timed_call(fn, device: torch.device) -> tuple[float, object, float | None]:
    """(milliseconds, result, peak GiB allocated beyond what was allocated before; None off the GPU) of one call,
    the device drained before and after."""
    sync(device)
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


class Context:
    """What the cases of one model share: device, dtype, arguments, the random adapter, reference logits."""

    def __init__(self, pair: ModelPair, args, device, dtype, log: RowLog):
        self.pair, self.args, self.log = pair, args, log
        self.device, self.dtype = device, dtype
        self.refs: dict[tuple[object, str], torch.Tensor] = {}  # (case, mode) -> logits compared across modes
        self.hf_step_drift: dict[object, float] = {}  # decode case -> transformers' step vs its own forward pass
        # decode context -> (tokens transformers' eager decode generated, its second step's logits of row 0): the
        # compiled decode is forced to the same tokens and checked against those logits
        self.hf_eager_steps: dict[int, tuple[list[int], torch.Tensor]] = {}
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
        if mode in HF_MODES and self.pair.hf is None:
            return f"transformers could not load the model: {self.pair.hf_error}"
        if mode == "sparse_gdn" and not self.hybrid:
            return "the model has no GDN layers"
        return None


def check_logits(row: dict, ctx: Context, mode: str, case: tuple, logits: torch.Tensor) -> None:
    """Compare ``logits`` (of ``case``: the last prefill rows, or the first decode step) with ours-dense's and, for
    ours-dense, with transformers'. The references are the modes that ran earlier in this run (hf, then dense)."""
    logits = logits.float().cpu()
    ctx.refs[(case, mode)] = logits
    row["check_finite"] = bool(torch.isfinite(logits).all())
    dense, hf = ctx.refs.get((case, "dense")), ctx.refs.get((case, "hf"))
    if mode == "dense":
        if hf is not None:
            row["check_rel_vs_hf"] = rel_err(logits, hf)
            row["check_top1_vs_hf"] = top1_agreement(logits, hf)
            row["check_tol"] = max(DENSE_TOL, DECODE_DRIFT_FACTOR * ctx.hf_step_drift.get(case, 0.0))
            row["checks_pass"] = row["check_finite"] and row["check_rel_vs_hf"] <= row["check_tol"]
        else:
            row["checks_pass"] = None
            row["check_note"] = "no transformers logits in this run to compare with"
        return
    if dense is not None:
        row["check_rel_vs_dense"] = rel_err(logits, dense)
        row["check_top1_vs_dense"] = top1_agreement(logits, dense)
    elif mode != "hf":
        row["check_note"] = "no ours-dense logits in this run to compare with"
    # the approximate modes have no threshold: their difference from dense is the measured approximation
    row["checks_pass"] = row["check_finite"]


def guarded(row: dict, ctx: Context, fn) -> None:
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
        free_memory(ctx.device)
        ctx.log.save()


def brief(row: dict) -> str:
    """One line for the progress log: the time, the reason it was skipped or the error."""
    for key in ("skipped", "error"):
        if key in row:
            return f"{key}: {row.get('detail', row[key])}"
    if "ms" in row:
        return f"{row['ms']:.1f} ms" + (f", peak +{row['peak_gib']:.2f} GiB" if row.get("peak_gib") is not None else "")
    if "tokens_per_s" in row:
        return f"{row['tokens_per_s']:.1f} tok/s"
    return "?"
