"""Locality of block selections from one decode step to the next, and a fitted process that reproduces it.

An offloaded KV cache copies, per decode step, attention layer and KV head, the selected *dynamic* blocks (neither
init nor local-window blocks) that its GPU slots do not hold. How many that is depends on how a model's selections
persist across steps, which random weights do not have (their selections are nearly independent from step to step).
This module measures that persistence on recorded traces (:mod:`longsparse.engine.traces`, SmolLM2 on real text)
and models it for ``longsparse bench decode``:

* :func:`trace_locality`: a trace's hit rates — the share of a step's selected blocks that the previous step also
  selected (all blocks, and split into forced and dynamic ones), the share of its dynamic blocks already in a slot
  cache of a given size run by the copy planner's rule (:func:`slot_cache_hits`), the overlap with the step ``d``
  steps back, the probability that a dynamic block stays selected given how many steps it has been (its *age*) and
  the lengths of completed runs;
* :func:`fit_hazard`: the probability ``h_l(a)`` that a dynamic block of attention layer ``l`` selected for the last
  ``a`` consecutive steps is not selected at the next one (ages ``>= max_age`` pooled), from traces, runs that began
  before the trace counted once their age is certain;
* :class:`LocalityProcess`: selections drawn at any geometry from per-layer *release* hazards — each of a row's
  dynamic places holds a block until it is released (a renewal process per place, started in its stationary age
  distribution) and then takes a block drawn uniformly from the causal candidates not kept;
* :func:`fit_process`: the release hazards from traces — the observed hazards corrected for the chance that a
  released block is drawn again (large with SmolLM2's few candidates at 2K, below 1 % with MiniCPM4's ~2000 at
  128K; :func:`release_hazard`), calibrated so that the process replayed at the traces' own geometry has their hit
  rate.

What carries the fit from SmolLM2's contexts (2K–8K, 24–117 candidate blocks) to MiniCPM4's 128K (~2000) is the
assumption that how long a model keeps a block selected, beyond chance, does not depend on how many candidates there
are; ``bench locality`` tests it by replaying the process fitted at the longest context at the shorter ones.

``longsparse bench locality`` analyses a trace file, fits the hazards and writes ``benchmarks/results/locality.json``
(read by ``longsparse bench decode --selections locality``) and a plot.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..engine.traces import SelectionTrace, forced_mask, load_traces
from ..ops.sparse_attn import MINICPM4, SparseAttentionConfig
from ..ops.transfer import max_dynamic_blocks

NAME = "locality"
MAX_AGE = 32
"""Runs of at least this many steps share one hazard (the tail of the run-length distribution)."""
MAX_LAG = 64


def dynamic_blocks(trace: SelectionTrace) -> np.ndarray:
    """``[steps, layers, heads, num_blocks]`` bool: the selected blocks that are neither init nor window blocks."""
    return trace.selected & ~trace.forced()[:, None, None, :]


def slot_cache_hits(dynamic: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Hits and dynamic entries per step ``([steps], [steps])`` of ``dynamic [steps, rows, num_blocks]`` (bool) in a
    slot cache of ``slots`` places per row, run by the copy planner's rule (``ops.transfer.naive``): a selected block
    held by a slot is a hit and keeps it; the k-th miss (ascending block order) takes the k-th slot (in slot order)
    that holds no selected block; other slots keep their old block. Step 0 starts from empty slots."""
    steps, rows, _ = dynamic.shape
    hits, counts = np.zeros(steps, dtype=np.int64), dynamic.sum(axis=(1, 2)).astype(np.int64)
    for r in range(rows):
        held = [-1] * slots
        for t in range(steps):
            selected = np.flatnonzero(dynamic[t, r]).tolist()
            chosen = set(selected)
            place = {b: j for j, b in enumerate(held) if b >= 0}
            misses = [b for b in selected if b not in place]
            hits[t] += len(selected) - len(misses)
            free = [j for j, b in enumerate(held) if b not in chosen]
            if len(misses) > len(free):
                raise ValueError(f"step {t} selects {len(selected)} dynamic blocks, more than the {slots} slots")
            for b, j in zip(misses, free):
                held[j] = b
    return hits, counts


def _run_ages(dynamic: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(age, truncated)`` of ``dynamic [steps, ...]``: consecutive steps each selected block has been selected
    (0 where not selected), and whether its run began before the first step (its true age is then larger)."""
    age = np.zeros(dynamic.shape, dtype=np.int32)
    truncated = np.zeros(dynamic.shape, dtype=bool)
    age[0], truncated[0] = dynamic[0], dynamic[0]
    for t in range(1, dynamic.shape[0]):
        age[t] = (age[t - 1] + 1) * dynamic[t]
        truncated[t] = truncated[t - 1] & dynamic[t]
    return age, truncated


def _hazard_counts(dynamic: np.ndarray, max_age: int) -> tuple[np.ndarray, np.ndarray]:
    """``(at_risk, dropped) [layers, max_age]`` of ``dynamic [steps, layers, heads, num_blocks]``: blocks selected at
    step ``t`` with age bucket ``min(age, max_age)`` (index − 1) and how many of them step ``t + 1`` dropped."""
    age, truncated = _run_ages(dynamic)
    layers = dynamic.shape[1]
    at_risk = np.zeros((layers, max_age), dtype=np.int64)
    dropped = np.zeros((layers, max_age), dtype=np.int64)
    layer_of = np.broadcast_to(np.arange(layers)[None, :, None, None], dynamic.shape)
    known = dynamic[:-1] & (~truncated[:-1] | (age[:-1] >= max_age))
    bucket = np.minimum(age[:-1], max_age) - 1
    index = (layer_of[:-1] * max_age + bucket)[known]
    at_risk += np.bincount(index, minlength=layers * max_age).reshape(layers, max_age)
    gone = known & ~dynamic[1:]
    dropped += np.bincount((layer_of[:-1] * max_age + bucket)[gone], minlength=layers * max_age).reshape(
        layers, max_age
    )
    return at_risk, dropped


def trace_locality(trace: SelectionTrace, slots: int | None = None, max_lag: int = MAX_LAG) -> dict:
    """Locality figures of one trace (step 0 only fills the cache and is left out of the rates); ``slots``: dynamic
    slots per row of the slot cache (default: the most dynamic blocks any selection of the geometry holds, as
    ``BlockKVCache`` sizes it)."""
    cfg = trace.config
    if slots is None:
        slots = max_dynamic_blocks(cfg, trace.context + trace.steps)
    sel = trace.selected
    forced = trace.forced()[:, None, None, :]
    dyn = sel & ~forced
    steps, layers, heads, nb = sel.shape
    both = sel[1:] & sel[:-1]
    n_sel = sel[1:].sum()
    per_layer = [slot_cache_hits(dyn[:, i], slots) for i in range(layers)]
    hits, counts = sum(h for h, _ in per_layer), sum(c for _, c in per_layer)
    per_layer_hits = [float(h[1:].sum() / max(c[1:].sum(), 1)) for h, c in per_layer]
    lags = range(1, min(max_lag, steps - 1) + 1)
    overlap = [float((dyn[d:] & dyn[:-d]).sum() / max(dyn[d:].sum(), 1)) for d in lags]
    at_risk, dropped = _hazard_counts(dyn, MAX_AGE)
    risk, drop = at_risk.sum(0), dropped.sum(0)
    age, truncated = _run_ages(dyn)
    ended = dyn[:-1] & ~dyn[1:] & ~truncated[:-1]
    runs = age[:-1][ended]
    return dict(
        selector=trace.label, context=trace.context, steps=steps, layers=layers, heads=heads, slots=slots,
        selected_per_row=float(sel[1:].sum() / ((steps - 1) * layers * heads)),
        dynamic_per_row=float(dyn[1:].sum() / ((steps - 1) * layers * heads)),
        candidates_per_row=float(np.mean(trace.positions() // cfg.block_size - cfg.local_blocks - cfg.init_blocks)),
        forced_share=float((sel[1:] & forced[1:]).sum() / n_sel),
        hit_rate_all=float(both.sum() / n_sel),
        hit_rate_all_forced_part=float((both & forced[1:]).sum() / n_sel),
        hit_rate_all_dynamic_part=float((both & ~forced[1:]).sum() / n_sel),
        hit_rate_dynamic=float(hits[1:].sum() / max(counts[1:].sum(), 1)),
        hit_rate_dynamic_per_step=(hits[1:] / np.maximum(counts[1:], 1)).tolist(),
        hit_rate_dynamic_per_layer=per_layer_hits,
        overlap_by_lag=overlap,
        stay_by_age=[float(1 - d / r) if r else None for r, d in zip(risk, drop)],
        at_risk_by_age=risk.tolist(),
        run_length_mean=float(runs.mean()) if runs.size else None,
        run_length_histogram=np.bincount(np.minimum(runs, MAX_LAG), minlength=MAX_LAG + 1)[1:].tolist(),
    )  # fmt: skip


def fit_hazard(traces: Sequence[SelectionTrace], max_age: int = MAX_AGE) -> np.ndarray:
    """``[layers, max_age]``: per attention layer (the traces' order) the probability that a dynamic block selected
    for ``a`` consecutive steps (``a = 1 … max_age``, the last entry for every ``a >= max_age``) is not selected at
    the next step, pooled over the traces' heads and steps. A layer-age cell with fewer than 20 observations takes
    the value of all layers pooled."""
    if not traces:
        raise ValueError("fit_hazard needs at least one trace")
    layers = {t.selected.shape[1] for t in traces}
    if len(layers) != 1:
        raise ValueError(f"traces of different layer counts: {sorted(layers)}")
    at_risk = sum(_hazard_counts(dynamic_blocks(t), max_age)[0] for t in traces)
    dropped = sum(_hazard_counts(dynamic_blocks(t), max_age)[1] for t in traces)
    pooled = dropped.sum(0) / np.maximum(at_risk.sum(0), 1)
    if at_risk.sum(0)[0] == 0:
        raise ValueError("the traces hold no dynamic block runs to fit")
    pooled = _fill_forward(pooled, at_risk.sum(0) > 0)
    hazard = np.where(at_risk >= 20, dropped / np.maximum(at_risk, 1), pooled[None])
    return np.clip(hazard, 1e-4, 1.0)


def _fill_forward(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Each invalid entry takes the last valid one before it."""
    out = values.copy()
    for i in range(1, len(out)):
        if not valid[i]:
            out[i] = out[i - 1]
    return out


def fit_process(traces: Sequence[SelectionTrace], iterations: int = 12) -> LocalityProcess:
    """The :class:`LocalityProcess` that drops blocks as ``traces`` (one selector, geometry and context; several
    texts or runs pool) do at their geometry: the observed hazards (:func:`fit_hazard`) corrected for the chance
    re-selection of :func:`release_hazard` (per-layer drop rates of the traces), the correction scaled so that the
    process replayed at the traces' geometry (:func:`replayed_hit_rate`) has their dynamic hit rate (bisection)."""
    if not traces or len({(t.config, t.context, t.steps, t.selected.shape[1:3]) for t in traces}) != 1:
        raise ValueError("fit_process needs traces of one geometry, context, length and model")
    first = traces[0]
    dyn = [dynamic_blocks(t) for t in traces]
    kept = sum((d[1:] & d[:-1]).sum(axis=(0, 2, 3)) for d in dyn)
    total = sum(d[1:].sum(axis=(0, 2, 3)) for d in dyn)
    target = kept.sum() / total.sum()
    cfg, (layers, heads) = first.config, first.selected.shape[1:3]
    k = cfg.budget_blocks - (cfg.init_blocks + cfg.local_blocks + 1)
    n = float(np.mean(first.positions() // cfg.block_size - cfg.local_blocks - cfg.init_blocks))
    observed = fit_hazard(traces)
    drop_rate = 1 - kept / np.maximum(total, 1)

    def process(scale: float) -> LocalityProcess:
        return LocalityProcess(release_hazard(observed, drop_rate, k, n, scale))

    lo, hi = 0.0, 2.0
    for _ in range(iterations):
        mid = (lo + hi) / 2
        steps = min(first.steps, 64)
        if replayed_hit_rate(process(mid), cfg, layers, heads, first.context, steps) > target:
            lo = mid
        else:
            hi = mid
    return process((lo + hi) / 2)


def release_hazard(
    observed: np.ndarray, drop_rate: np.ndarray, dynamic: int, candidates: float, scale: float = 1.0
) -> np.ndarray:
    """The hazard ``[layers, ages]`` with which a :class:`LocalityProcess` must *release* blocks so that, at a geometry
    of ``dynamic`` blocks chosen from ``candidates``, it drops them at the ``observed`` rates (:func:`fit_hazard`).

    A released place is refilled uniformly from the candidates not kept, the released block among them, so a block
    is dropped with probability ``h (1 − c)``: ``c = k r / (N − k + k r)`` is the chance that it is drawn again, ``r``
    the layer's release rate per block and step (``drop_rate [layers] / (1 − c)``, a fixed point); ``scale``
    multiplies ``c`` (:func:`fit_process` calibrates it). With few candidates (SmolLM2 at 2K: 14 of 25) ``c`` is
    large; at MiniCPM4's 128K (62 of ~2000) it is below 1 %: the correction removes what chance, not the model, kept
    selected."""
    k, n = float(dynamic), float(candidates)
    if not 0 < k <= n:
        raise ValueError(f"need 0 < dynamic <= candidates, got {dynamic} and {candidates}")
    r = np.asarray(drop_rate, dtype=np.float64).copy()
    for _ in range(50):
        c = k * r / (n - k + k * r)
        r = np.asarray(drop_rate) / (1 - c)
    return np.clip(observed / np.maximum(1 - scale * c, 1e-3)[:, None], 1e-4, 1.0)


@dataclass(frozen=True, eq=False)
class LocalityProcess:
    """Dynamic block selections whose places release their blocks with ``hazard [source_layers, max_age]`` — the
    probability that a block held for ``a`` consecutive steps is released at the next one (:func:`release_hazard`).

    Each (layer, sequence, KV head) row holds ``k = budget − forced`` dynamic blocks; every place is a renewal process
    started in its stationary age distribution; a released place takes a block drawn uniformly from the causal
    candidates not kept (the released block may be drawn again: its run then goes on). Target attention layer ``i`` of
    ``n`` uses source layer ``round(i · (source_layers − 1) / (n − 1))`` (layers mapped by relative depth).
    """

    hazard: np.ndarray

    def __post_init__(self):
        h = np.asarray(self.hazard, dtype=np.float64)
        if h.ndim != 2 or h.shape[1] < 1 or not np.all((h > 0) & (h <= 1)):
            raise ValueError(f"hazard must be [layers, ages] with entries in (0, 1], got shape {h.shape}")
        object.__setattr__(self, "hazard", h)

    def layer_map(self, num_layers: int) -> np.ndarray:
        """Source layer of each of ``num_layers`` target layers."""
        src = self.hazard.shape[0]
        if num_layers == 1:
            return np.zeros(1, dtype=np.int64)
        return np.rint(np.arange(num_layers) * (src - 1) / (num_layers - 1)).astype(np.int64)

    def survival(self, layer: int, ages: int) -> np.ndarray:
        """``S(a)`` for ``a = 1 … ages``: the probability that a place keeps its block for at least ``a`` steps."""
        h = self.hazard[layer]
        hz = np.concatenate([h, np.full(max(0, ages - len(h)), h[-1])])[:ages]
        return np.concatenate([[1.0], np.cumprod(1 - hz[:-1])])

    def mean_run_length(self, layer: int) -> float:
        """Expected steps between releases of source layer ``layer``'s places (the tail beyond ``max_age`` summed in
        closed form)."""
        A = self.hazard.shape[1]
        s = self.survival(layer, A)
        return float(s[:-1].sum() + s[-1] / self.hazard[layer, -1])

    def expected_hit_rate(self, num_layers: int, config: SparseAttentionConfig, position: int) -> float:
        """Stationary share of dynamic blocks that the previous step selected too, at geometry ``config`` and a query
        at ``position``, averaged over ``num_layers`` target layers: ``1 − r (1 − c)`` (:func:`release_hazard`)."""
        k = config.budget_blocks - (config.init_blocks + config.local_blocks + 1)
        n = position // config.block_size - config.local_blocks - config.init_blocks
        rates = np.array([1 / self.mean_run_length(int(i)) for i in self.layer_map(num_layers)])
        c = k * rates / (n - k + k * rates)
        return float(np.mean(1 - rates * (1 - c)))

    def _stationary_ages(self, layer_of: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
        """``[len(layer_of), k]`` ages (capped at ``max_age``) drawn from each row's stationary age distribution,
        ``P(a) ∝ S(a)`` (the tail bucket holds every age from ``max_age`` on)."""
        A = self.hazard.shape[1]
        weights = np.empty_like(self.hazard)
        for src in range(self.hazard.shape[0]):
            s = self.survival(src, A)
            weights[src] = np.concatenate([s[:-1], [s[-1] / self.hazard[src, -1]]])
        cdf = np.cumsum(weights, axis=1) / weights.sum(axis=1, keepdims=True)
        u = rng.random((len(layer_of), k))
        ages = np.empty(u.shape, dtype=np.int32)
        for src in np.unique(layer_of):
            rows = layer_of == src
            ages[rows] = np.minimum(np.searchsorted(cdf[src], u[rows], side="right"), A - 1) + 1
        return ages

    def selections(
        self, config: SparseAttentionConfig, num_layers: int, rows: int, start: int, steps: int,
        rng: np.random.Generator, width: int | None = None,
    ) -> np.ndarray:  # fmt: skip
        """``[steps, num_layers, rows, width]`` int32 block lists of decode steps whose tokens sit at positions
        ``start … start + steps − 1`` (every row at the same position), as the decode selectors return them: init,
        dynamic and window blocks in ascending order, −1 padded to ``width`` (default ``config.decode_width()``).
        ``rows``: (sequence, KV head) pairs per layer. Positions must lie at or beyond ``config.dense_len``, with at
        least as many candidate blocks as a selection has dynamic ones."""
        width = config.decode_width() if width is None else width
        if start < config.dense_len or start < 0:
            raise ValueError(f"start={start} is below dense_len={config.dense_len}: those steps select every block")
        if steps <= 0 or rows <= 0 or num_layers <= 0:
            raise ValueError(f"steps, rows and num_layers must be positive, got {steps}, {rows}, {num_layers}")
        init, local, bs = config.init_blocks, config.local_blocks, config.block_size
        k = config.budget_blocks - (init + local + 1)
        candidates = start // bs - local - init
        if k <= 0 or candidates < k:
            raise ValueError(
                f"position {start} has {candidates} candidate blocks; the process needs at least the {k} dynamic "
                "blocks of a full selection"
            )
        if config.budget_blocks > width:
            raise ValueError(f"a selection of {config.budget_blocks} blocks does not fit width={width}")
        out = np.full((steps, num_layers, rows, width), -1, dtype=np.int32)
        R = num_layers * rows
        layer_of = np.repeat(self.layer_map(num_layers), rows)
        hz = self.hazard[layer_of]  # [R, A]
        A = hz.shape[1]
        blocks = _distinct_draws(np.full((R, k), -1), np.zeros((R, k), bool), init, start // bs - local, rng)
        ages = self._stationary_ages(layer_of, k, rng)
        for t in range(steps):
            pos = start + t
            if t > 0:
                release = rng.random((R, k)) < np.take_along_axis(hz, np.minimum(ages, A) - 1, axis=1)
                drawn = _distinct_draws(blocks, ~release, init, pos // bs - local, rng)
                ages = np.where(drawn == blocks, ages + 1, 1)  # a block drawn again goes on with its run
                blocks = drawn
            qb = pos // bs
            out[t, :, :, :init] = np.arange(init)
            out[t, :, :, init : init + k] = np.sort(blocks, axis=1).reshape(num_layers, rows, k)
            out[t, :, :, init + k : init + k + local + 1] = np.arange(qb - local, qb + 1)
        return out


def _distinct_draws(
    blocks: np.ndarray, keep: np.ndarray, lo: int, hi: int, rng: np.random.Generator
) -> np.ndarray:  # fmt: skip
    """``blocks [R, k]`` with every entry not kept replaced by a block drawn uniformly from ``lo … hi − 1`` that is
    neither kept nor drawn twice in its row (a released block may be drawn again)."""
    R, k = blocks.shape
    rows = np.arange(R)[:, None]
    taken = np.zeros((R, hi), dtype=bool)
    taken[np.broadcast_to(rows, blocks.shape)[keep], blocks[keep]] = True
    out = blocks.copy()
    claim = np.empty((R, hi), dtype=np.int32)
    rr, jj = np.nonzero(~keep)
    while rr.size:
        vals = rng.integers(lo, hi, size=rr.size)
        out[rr, jj] = vals
        free = ~taken[rr, vals]
        claim[rr[free], vals[free]] = jj[free]  # of equal draws in a row, one claims the block
        won = free.copy()
        won[free] = claim[rr[free], vals[free]] == jj[free]
        taken[rr[won], vals[won]] = True
        rr, jj = rr[~won], jj[~won]
    return out


def load_processes(path: str | Path) -> dict[str, LocalityProcess]:
    """The fitted processes ``{selector: LocalityProcess}`` of a ``longsparse bench locality`` result file."""
    from ..reports.results import load

    fits = {r["selector"]: r for r in load(path)["rows"] if r.get("kind") == "process"}
    if not fits:
        raise ValueError(f"{path} holds no fitted locality process; write it with `longsparse bench locality`")
    return {name: LocalityProcess(np.asarray(fit["hazard"])) for name, fit in fits.items()}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--traces", default="benchmarks/traces/selections.npz",
                        help="trace file of `longsparse eval traces` (default: %(default)s)")  # fmt: skip
    parser.add_argument("--fit-context", type=int, default=None,
                        help="fit the processes on the traces of this context (default: the longest)")  # fmt: skip


def run(args) -> int:
    from ..reports.results import BenchmarkResult

    traces = load_traces(args.traces)
    if not traces:
        raise ValueError(f"{args.traces} holds no traces")
    res = BenchmarkResult(NAME)
    res.environment["traces"] = str(args.traces)
    contexts = sorted({t.context for t in traces})
    fit_context = args.fit_context if args.fit_context is not None else contexts[-1]
    if fit_context not in contexts:
        raise ValueError(f"--fit-context {fit_context}: the traces have contexts {contexts}")
    s = res.summary
    for selector in dict.fromkeys(t.label for t in traces):
        mine = sorted((t for t in traces if t.label == selector), key=lambda t: t.context)
        process = fit_process([t for t in mine if t.context == fit_context])
        for trace in mine:
            row = res.add(kind="trace", **trace_locality(trace))
            own = fit_process([trace])
            row["predicted_hit_rate_dynamic"] = replayed_hit_rate(process, trace.config, len(trace.layers),
                                                                  trace.heads, trace.context)  # fmt: skip
            row["own_fit_hit_rate_128k"] = own.expected_hit_rate(32, MINICPM4, 131072)
            s[f"hit_rate_dynamic_{selector}_{trace.context}"] = row["hit_rate_dynamic"]
            print(f"{selector:>16} @ {trace.context:>5}: dynamic hit rate {row['hit_rate_dynamic']:.3f} "
                  f"(fit at {fit_context}: {row['predicted_hit_rate_dynamic']:.3f}), all blocks "
                  f"{row['hit_rate_all']:.3f} (forced {row['hit_rate_all_forced_part']:.3f}), mean run "
                  f"{row['run_length_mean'] or float('nan'):.1f} steps; its own fit at 128K: "
                  f"{row['own_fit_hit_rate_128k']:.3f}", flush=True)  # fmt: skip
        replayed = replayed_hit_rate(process, MINICPM4, 32, 2, 131072 - 64)
        s[f"predicted_hit_rate_128k_{selector}"] = replayed
        res.add(kind="process", selector=selector, context=fit_context, hazard=process.hazard.tolist(),
                expected_hit_rate_128k=process.expected_hit_rate(32, MINICPM4, 131072),
                replayed_hit_rate_128k=replayed)  # fmt: skip
    res.notes.append(
        "hit_rate_dynamic: share of a step's dynamic (non-forced) blocks already in a slot cache of max_dynamic_blocks "
        "slots run by the copy planner's rule; hit_rate_all: share of a step's selected blocks (forced included) also "
        "selected at the previous step, split into forced and dynamic parts; stay_by_age[a-1]: probability that a "
        "dynamic block selected for a consecutive steps is selected at the next; step 0 of each trace left out. "
        f"process rows: LocalityProcess release hazards fitted to the {fit_context}-token traces (fit_process); "
        f"predicted_hit_rate_dynamic: that process replayed at each trace's geometry (a check of how it carries "
        "across contexts); predicted_hit_rate_128k_*: replayed at MiniCPM4.1-8B geometry, 128K, through the same "
        "slot-cache rule; own_fit_hit_rate_128k: each context's own fit carried to 128K."
    )
    out = Path(args.out)
    path = res.save(out / "results")
    plot(res.rows, out / "plots" / f"{NAME}.png")
    print(f"wrote {path}")
    return 0


def replayed_hit_rate(
    process: LocalityProcess, config: SparseAttentionConfig, layers: int, heads: int, start: int, steps: int = 64,
    seed: int = 0,
) -> float:  # fmt: skip
    """Dynamic hit rate of ``process``'s selections for ``layers`` attention layers of ``heads`` KV heads over
    ``steps`` decode steps from position ``start``, in a slot cache of ``max_dynamic_blocks`` slots — as the block
    cache of ``bench decode --selections locality`` sees them (step 0 fills the cache and is left out)."""
    sel = process.selections(config, layers, heads, start, steps, np.random.default_rng(seed))
    nb = config.num_blocks(start + steps)
    mask = np.zeros((steps, layers, heads, nb + 1), dtype=bool)
    np.put_along_axis(mask, np.where(sel >= 0, sel, nb).astype(np.int64), True, axis=3)
    forced = forced_mask(start + np.arange(steps), nb, config)
    dyn = mask[..., :nb] & ~forced[:, None, None, :]
    hits, counts = slot_cache_hits(dyn.reshape(steps, layers * heads, nb), max_dynamic_blocks(config, start + steps))
    return float(hits[1:].sum() / counts[1:].sum())


def plot(rows: list[dict], path: Path) -> Path:
    """Three panels: hit rates against context length; the probability of staying selected against age; the overlap
    with the selection ``d`` steps earlier."""
    from ..reports.plot import pyplot, save_figure

    plt = pyplot()
    traces = [r for r in rows if r.get("kind") == "trace"]
    selectors = list(dict.fromkeys(r["selector"] for r in traces))
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8), dpi=120)
    for i, sel in enumerate(selectors):
        mine = sorted((r for r in traces if r["selector"] == sel), key=lambda r: r["context"])
        x = [r["context"] for r in mine]
        c = f"C{i}"
        axes[0].plot(x, [r["hit_rate_dynamic"] for r in mine], "o-", color=c, label=f"{sel}: dynamic, slot cache")
        axes[0].plot(x, [r["hit_rate_all"] for r in mine], "s--", color=c, label=f"{sel}: all selected blocks")
        axes[0].plot(x, [r["hit_rate_all_forced_part"] for r in mine], "^:", color=c, label=f"{sel}: of which forced")
        axes[0].plot(x, [r["predicted_hit_rate_dynamic"] for r in mine], "x-.", color=c, alpha=0.6,
                     label=f"{sel}: dynamic, process fitted at {max(x)}")  # fmt: skip
        for j, r in enumerate(mine):
            style = dict(color=c, alpha=0.4 + 0.6 * (j + 1) / len(mine))
            ages = [a + 1 for a, v in enumerate(r["stay_by_age"]) if v is not None]
            axes[1].plot(ages, [v for v in r["stay_by_age"] if v is not None], label=f"{sel} @ {r['context']}",
                         **style)  # fmt: skip
            axes[2].plot(range(1, len(r["overlap_by_lag"]) + 1), r["overlap_by_lag"], label=f"{sel} @ {r['context']}",
                         **style)  # fmt: skip
    contexts = sorted({r["context"] for r in traces})
    axes[0].set(title="hit rate vs context (SmolLM2-135M, real text)", xlabel="context (tokens)", ylabel="share",
                xscale="log", ylim=(0, 1))  # fmt: skip
    axes[0].set_xticks(contexts, [str(c) for c in contexts])
    axes[0].minorticks_off()
    axes[1].set(title="P(still selected next step | selected for a steps)", xlabel="a (steps; last: >= 32)",
                ylabel="probability", ylim=(0, 1))  # fmt: skip
    axes[2].set(title="dynamic blocks also selected d steps earlier", xlabel="d (steps)", ylabel="share",
                ylim=(0, 1))  # fmt: skip
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, path)
