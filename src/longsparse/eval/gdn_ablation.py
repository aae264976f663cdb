"""SparseGDN's ablation on a model whose recall runs through its GDN states (the all-GDN testbed, docs/hybrid.md).

Every variant loads the model through ``LLM(..., gdn="sparse", sparse_gdn_config=..., sparse_gdn_kernel_config=...)``
(``gdn="dense"`` for the reference) and prefills the same samples of :mod:`.state_recall` (needles and MQAR in
held-out text). Per sample and variant it records the score (share of values predicted), which needles were found,
the relative error of every position's logits against dense GDN and of each GDN layer's output (the mixer's, before
the residual) against the dense run's same layer; per held-out text window, the logit fidelity (:mod:`.fidelity`)
and the bits per byte. Scores pair across variants (same samples), so differences come with paired bootstrap intervals
(:mod:`.paired`).

The samples run in rounds (``per_round`` of every task and length, all variants), and the results are written after
each round, so a run cut short by a time limit still holds a balanced, paired set.

    python -m longsparse.eval.gdn_ablation --model models/gdn-recall --out benchmarks/results/quality_gdn.json \
        --plot benchmarks/plots/quality_gdn.png
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ..ops.gdn import SparseGDNConfig, SparseGDNKernelConfig
from ..tasks.state_recall import TASKS, Haystack, RecallSample, RecallTasks, RecallVocab
from .fidelity import logit_fidelity
from .paired import DEFAULT_RESAMPLES, paired_bootstrap

PAPER_RATIOS = (0.08, 0.30, 0.95)
TAIL_FROM = 48
"""A needle's value at chunk offset >= 48 is in the rows the tail-16 score reads."""


@dataclass(frozen=True)
class Variant:
    """One way to run the GDN layers: ``config`` None is dense GDN; ``kernel_config``: how a sparse variant runs
    (None: the defaults)."""

    name: str
    config: SparseGDNConfig | None
    description: str
    kernel_config: SparseGDNKernelConfig | None = None


def scaled_ratios(factor: float) -> tuple[float, float, float]:
    return tuple(round(r * factor, 6) for r in PAPER_RATIOS)


def default_variants(backend: str = "torch") -> list[Variant]:
    """Dense GDN, SparseGDN's default, and the ablations (Sec. 3.5 of SparseGDN (Zhuang et al., arXiv:2610.41420) and
    the controls). Every sparse variant runs ``backend`` (the specification by default: one implementation for every
    row)."""

    def cfg(**kw) -> SparseGDNConfig:
        return SparseGDNConfig(**kw)

    kernel_config = SparseGDNKernelConfig(backend=backend)
    variants = [
        Variant("dense", None, "dense GDN (the reference)"),
        Variant("sparse", cfg(), "SparseGDN's default selection"),
        Variant("random", cfg(selection="uniform_random"), "random events at a mid pair's budget, no tiers or anchors"),
        Variant("random_tiers", cfg(selection="random"), "random chunk ranking, the default's tiers and anchors kept"),
        Variant("fixed_tiers", cfg(selection="fixed_tiers"), "tier counts fixed (9 low / 4 mid / 3 high)"),
        Variant("full_solve", cfg(solve="full"), "the exact intra-chunk solve in place of the block-adjacent one"),
        Variant("all_events", cfg(selection="all"), "every event kept: the block-adjacent solve alone"),
        Variant("no_visibility", cfg(visibility=False), "the gate-visibility factor off (G_h = 1)"),
        Variant("per_chunk_output", cfg(output="per_chunk"), "no two-chunk groups: each chunk reads its own state"),
        Variant("budget_20", cfg(tier_ratios=scaled_ratios(2 / 3)), "default selection, tier ratios x 2/3"),
        Variant("budget_10", cfg(tier_ratios=scaled_ratios(1 / 3)), "default selection, tier ratios x 1/3"),
        Variant(
            "random_10",
            cfg(selection="uniform_random", tier_ratios=scaled_ratios(1 / 3)),
            "random events at the x 1/3 budget, no tiers or anchors",
        ),
    ]
    return [v if v.config is None else replace(v, kernel_config=kernel_config) for v in variants]


def gdn_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    from ..models.layers import GatedDeltaNet

    return [m for m in model.modules() if isinstance(m, GatedDeltaNet)]


@dataclass
class PrefillResult:
    """Per sequence: ``logits [T, V]`` and each GDN layer's output ``[T, hidden]``; ``keep_ratio``: the batch's mean
    over sparse GDN layers (None for dense)."""

    logits: list[torch.Tensor]
    layer_outputs: list[list[torch.Tensor]]
    keep_ratio: float | None


def prefill(llm, sequences: Sequence[np.ndarray]) -> PrefillResult:
    """One packed prefill of ``sequences`` through the library's runner, every position's logits kept."""
    captured: list[torch.Tensor] = []
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: captured.append(out.float())) for m in gdn_layers(llm.loaded.model)
    ]
    try:
        out = llm.runner.prefill([s.tolist() for s in sequences], all_logits=True)
    finally:
        for h in hooks:
            h.remove()
    bounds = np.cumsum([0] + [len(s) for s in sequences])
    split = lambda x: [x[a:b] for a, b in zip(bounds[:-1], bounds[1:])]  # noqa: E731
    per_layer = [split(layer) for layer in captured]
    ratios = out.gdn_keep_ratios
    return PrefillResult(
        logits=split(out.logits.float()),
        layer_outputs=[[layer[i] for layer in per_layer] for i in range(len(sequences))],
        keep_ratio=float(np.mean(ratios)) if ratios else None,
    )


def relative_error(reference: torch.Tensor, other: torch.Tensor) -> float:
    return float((other.double() - reference.double()).norm() / reference.double().norm())


def bits_per_byte(logits: torch.Tensor, tokens: np.ndarray) -> float:
    """Mean next-token loss (bits) of ``tokens [T]`` under ``logits [T, V]``."""
    target = torch.as_tensor(tokens[1:], device=logits.device)
    loss = torch.nn.functional.cross_entropy(logits[:-1].double(), target)
    return float(loss) / math.log(2)


def batches(items: Sequence, lengths: Sequence[int], batch_tokens: int):
    """Consecutive groups of ``items`` holding at most ``batch_tokens`` tokens (one item at least)."""
    group, size = [], 0
    for item, n in zip(items, lengths):
        if group and size + n > batch_tokens:
            yield group
            group, size = [], 0
        group.append(item)
        size += n
    if group:
        yield group


def run_samples(llms: dict, samples: Sequence[RecallSample], batch_tokens: int) -> list[dict]:
    """Rows of the recall samples under every variant (``llms``: name -> LLM, ``"dense"`` first)."""
    rows = []
    for group in batches(samples, [s.tokens.size for s in samples], batch_tokens):
        results = {name: prefill(llm, [s.tokens for s in group]) for name, llm in llms.items()}
        dense = results["dense"]
        for i, s in enumerate(group):
            row = {"id": s.id, "task": s.task, "target_length": s.target_length,
                   "needle_offsets": s.needle_offsets.tolist(), "score": {}, "hits": {}, "logit_error": {},
                   "layer_error": {}, "keep_ratio": {}}  # fmt: skip
            for name, res in results.items():
                hits = s.hits(res.logits[i].argmax(-1).cpu().numpy())
                row["score"][name] = float(hits.mean())
                row["hits"][name] = "".join("1" if h else "0" for h in hits)
                row["keep_ratio"][name] = res.keep_ratio
                if name != "dense":
                    row["logit_error"][name] = relative_error(dense.logits[i], res.logits[i])
                    row["layer_error"][name] = [
                        relative_error(a, b) for a, b in zip(dense.layer_outputs[i], res.layer_outputs[i])
                    ]
            rows.append(row)
    return rows


def run_text(llms: dict, windows: Sequence[tuple[str, np.ndarray]], batch_tokens: int) -> list[dict]:
    """Rows of plain held-out text windows ``(id, tokens)``: bits per byte and logit fidelity against dense."""
    rows = []
    for group in batches(windows, [len(t) for _, t in windows], batch_tokens):
        results = {name: prefill(llm, [t for _, t in group]) for name, llm in llms.items()}
        for i, (wid, tokens) in enumerate(group):
            ref = results["dense"].logits[i]
            row = {"id": wid, "target_length": len(tokens), "bits_per_byte": {}, "fidelity": {}}
            for name, res in results.items():
                row["bits_per_byte"][name] = bits_per_byte(res.logits[i], tokens)
                if name != "dense":
                    row["fidelity"][name] = logit_fidelity(ref, res.logits[i]).as_dict()
            rows.append(row)
    return rows


def _paired(rows: list[dict], a: str, b: str, resamples: int) -> dict:
    """Paired bootstrap of ``b`` minus ``a`` (points), stratified by task and length."""
    strata = [(r["task"], r["target_length"]) for r in rows]
    diff = paired_bootstrap([r["score"][a] for r in rows], [r["score"][b] for r in rows], strata, resamples=resamples)
    return {"difference": diff.difference, "low": diff.low, "high": diff.high, "samples": diff.samples}


def aggregate_score(rows: list[dict], name: str) -> float:
    """Mean over (task, length) strata of the stratum's mean score, in percent (:mod:`.paired`'s aggregate)."""
    strata: dict[tuple, list[float]] = {}
    for r in rows:
        strata.setdefault((r["task"], r["target_length"]), []).append(r["score"][name])
    return 100.0 * float(np.mean([np.mean(v) for v in strata.values()]))


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def offset_accuracy(rows: list[dict], name: str) -> dict:
    """Share of needles found by ``name``, split by whether the needle's value sits in its chunk's tail rows."""
    found = {"tail": [0, 0], "body": [0, 0]}
    for r in rows:
        for hit, offset in zip(r["hits"][name], r["needle_offsets"]):
            part = found["tail" if offset >= TAIL_FROM else "body"]
            part[0] += hit == "1"
            part[1] += 1
    return {k: (100.0 * h / n if n else None) for k, (h, n) in found.items()}


def summarize(
    rows: list[dict],
    text_rows: list[dict],
    variants: Sequence[Variant],
    *,
    headline_random: str = "random",
    resamples: int = DEFAULT_RESAMPLES,
):
    """The summary (its headline keys: dense, sparse and random scores, keep ratio, paired differences) and one entry
    per variant: overall and per-length scores with paired differences against dense, logit and layer errors, keep
    ratio, needles found by chunk offset, and text fidelity."""
    lengths = sorted({r["target_length"] for r in rows})
    table = {}
    for v in variants:
        name = v.name
        entry = {"description": v.description, "score": aggregate_score(rows, name)}
        entry["keep_ratio"] = _mean(r["keep_ratio"][name] for r in rows)
        entry["needles_found"] = offset_accuracy(rows, name)
        if name != "dense":
            entry["minus_dense"] = _paired(rows, "dense", name, resamples)
            entry["logit_error"] = _mean(r["logit_error"][name] for r in rows)
            entry["layer_error"] = np.array([r["layer_error"][name] for r in rows]).mean(0).tolist()
        entry["per_length"] = {}
        for length in lengths:
            sub = [r for r in rows if r["target_length"] == length]
            per = {"score": aggregate_score(sub, name), "keep_ratio": _mean(r["keep_ratio"][name] for r in sub)}
            if name != "dense":
                per["minus_dense"] = _paired(sub, "dense", name, resamples)
                per["logit_error"] = _mean(r["logit_error"][name] for r in sub)
            entry["per_length"][str(length)] = per
        if text_rows:
            entry["text_bits_per_byte"] = _mean(r["bits_per_byte"][name] for r in text_rows)
            if name != "dense":
                for key in ("relative_error", "kl", "top1_agreement"):
                    entry[f"text_{key}"] = _mean(r["fidelity"][name][key] for r in text_rows)
        table[name] = entry
    sparse, random = table["sparse"], table[headline_random]
    summary = {
        "dense_score": table["dense"]["score"],
        "sparse_score": sparse["score"],
        "random_score": random["score"],
        "random_variant": headline_random,
        "keep_ratio": sparse["keep_ratio"],
        "random_keep_ratio": random["keep_ratio"],
        "samples": len(rows),
        "sparse_minus_dense": sparse["minus_dense"],
        "random_minus_dense": random["minus_dense"],
        "sparse_minus_random": _paired(rows, headline_random, "sparse", resamples),
    }
    summary["targets"] = {
        "testbed_can_fail (random_minus_dense.high < 0)": summary["random_minus_dense"]["high"] < 0,
        "sparse_keeps_accuracy (difference >= -0.5, interval reaching 0)": sparse["minus_dense"]["difference"] >= -0.5
        and sparse["minus_dense"]["high"] >= 0,
        "sparse_beats_random (sparse_score - random_score >= 1)": sparse["score"] - random["score"] >= 1,
    }
    return summary, table


def plot(path: str | Path, table: dict, title: str) -> Path:
    """Score against length per variant (left) and each variant's paired difference from dense (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [1.2, 1]})
    lengths = sorted(int(k) for k in table["dense"]["per_length"])
    for name, entry in table.items():
        ys = [entry["per_length"][str(k)]["score"] for k in lengths]
        style = dict(lw=2.5, color="black") if name == "dense" else dict(lw=1.4)
        left.plot(lengths, ys, marker="o", label=name, **style)
    left.set(xscale="log", xlabel="prompt length (tokens)", ylabel="score (% of values recalled)", title=title)
    left.set_xticks(lengths, [f"{k // 1024}K" if k % 1024 == 0 else str(k) for k in lengths])
    left.minorticks_off()
    left.legend(fontsize=7, ncol=2)
    others = [n for n in table if n != "dense"]
    diffs = [table[n]["minus_dense"] for n in others]
    y = np.arange(len(others))
    d = np.array([x["difference"] for x in diffs])
    err = np.array([[x["difference"] - x["low"] for x in diffs], [x["high"] - x["difference"] for x in diffs]])
    right.errorbar(d, y, xerr=err, fmt="o", capsize=3)
    right.axvline(0, color="grey", lw=0.8)
    right.set_yticks(y, [f"{n} ({100 * (table[n]['keep_ratio'] or 0):.0f}%)" for n in others], fontsize=8)
    right.invert_yaxis()
    right.set(xlabel="minus dense, points (paired 95% interval)", title="variant (keep ratio)")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return Path(path)


def run(
    model: str | Path,
    haystack: Haystack,
    *,
    lengths: Sequence[int],
    samples: int,
    per_round: int,
    text_per_length: int,
    variants: Sequence[Variant],
    device: str | None = None,
    dtype: torch.dtype = torch.float32,
    batch_tokens: int = 65536,
    seed: int = 42,
    pairs: int = 16,
    time_budget_s: float | None = None,
    on_round: Callable[[list[dict], list[dict]], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[dict], list[dict]]:
    """Evaluate ``variants`` on ``samples`` samples of each task at each length, in rounds of ``per_round``, and
    ``text_per_length`` held-out text windows of each length (spread over the rounds). Stops after the round in
    which ``time_budget_s`` passed; ``on_round(rows, text_rows)`` after every round."""
    from ..engine.api import LLM

    if variants[0].config is not None:
        raise ValueError(f"the first variant must be dense (config None), got {variants[0].name!r}")
    start = clock()
    llms = {}
    for v in variants:
        mode = "dense" if v.config is None else "sparse"
        llms[v.name] = LLM(
            model, gdn=mode, sparse_gdn_config=v.config, sparse_gdn_kernel_config=v.kernel_config, device=device,
            dtype=dtype,
        )  # fmt: skip
    vocab = RecallVocab(**_vocab_of(llms["dense"]))
    tasks = RecallTasks(haystack, seed=seed, pairs=pairs, vocab=vocab)
    rows, text_rows = [], []
    rounds = math.ceil(samples / per_round)
    for r in range(rounds):
        index = range(r * per_round, min(samples, (r + 1) * per_round))
        chosen = [tasks.sample(t, n, i) for n in lengths for t in TASKS for i in index]
        rows += run_samples(llms, chosen, batch_tokens)
        text_index = range(r * text_per_length // rounds, (r + 1) * text_per_length // rounds)
        windows = [(f"text-{n}-{i}", tasks.text(n, i)) for n in lengths for i in text_index]
        text_rows += run_text(llms, windows, batch_tokens)
        if on_round is not None:
            on_round(rows, text_rows)
        if time_budget_s is not None and clock() - start > time_budget_s:
            break
    return rows, text_rows


def _vocab_of(llm) -> dict:
    """The key and value counts of a testbed checkpoint (its vocabulary: 256 bytes, keys, values, 2 markers)."""
    recipe = Path(llm.loaded.source) / "recipe.json"
    if recipe.is_file():
        model = json.loads(recipe.read_text())["recipe"]["model"]
        return {"keys": model["keys"], "values": model["values"]}
    default = RecallVocab()
    if llm.config.vocab_size != default.size:
        raise ValueError(f"{llm.loaded.source} has no recipe.json and a vocabulary of {llm.config.vocab_size}, not "
                         f"the default testbed's {default.size}")  # fmt: skip
    return {"keys": default.keys, "values": default.values}


def resummarize(path: str | Path, plot_path: str | Path | None) -> int:
    """Rewrite a result's summary and variant table from its rows (20,000 resamples), and draw its plot."""
    result = json.loads(Path(path).read_text())
    variants = [Variant(name, None, v["description"]) for name, v in result["config"]["variants"].items()]
    summary, table = summarize(result["samples"], result["text"], variants,
                               headline_random=result["summary"]["random_variant"])  # fmt: skip
    result.update(summary=summary, variants=table)
    Path(path).write_text(json.dumps(result, indent=1) + "\n")
    if plot_path:
        plot(plot_path, table, "all-GDN recall testbed")
    print(json.dumps(summary, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    from ..reports.results import environment
    from ..tasks.tokens import parse_length

    parser = argparse.ArgumentParser(description="SparseGDN's ablation on the all-GDN recall testbed.")
    parser.add_argument("--model", required=True)
    parser.add_argument("--lengths", default="1k,2k,4k,8k")
    parser.add_argument("--samples", type=int, default=100, help="samples per task and length")
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--text", type=int, default=8, help="held-out text windows per length")
    parser.add_argument("--variants", default=None, help="comma-separated names (default: all; dense is added)")
    parser.add_argument("--backend", default="torch", help="SparseGDN backend of the sparse variants")
    parser.add_argument("--haystack", help="a saved haystack .npz (default: the text packages)")
    parser.add_argument("--device")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-tokens", type=int, default=65536)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--time-budget-s", type=float)
    parser.add_argument("--out", required=True)
    parser.add_argument("--plot")
    parser.add_argument("--resummarize", action="store_true", help="redo --out's summary and --plot from its rows")
    args = parser.parse_args(argv)
    if args.resummarize:
        return resummarize(args.out, args.plot)
    variants = default_variants(args.backend)
    if args.variants:
        wanted = {"dense", *(n.strip() for n in args.variants.split(","))}
        unknown = wanted - {v.name for v in variants}
        if unknown:
            parser.error(f"unknown variants {sorted(unknown)}; known: {[v.name for v in variants]}")
        variants = [v for v in variants if v.name in wanted]
    if "sparse" not in {v.name for v in variants}:
        parser.error("the variants must include sparse")
    lengths = [parse_length(x) for x in args.lengths.split(",")]
    haystack = Haystack.load(args.haystack) if args.haystack else Haystack.from_packages()
    config = {"model": str(args.model), "lengths": lengths, "samples_per_task": args.samples, "tasks": list(TASKS),
              "text_windows_per_length": args.text, "seed": args.seed, "device": args.device, "dtype": args.dtype,
              "variants": {v.name: {"description": v.description, "config": asdict(v.config) if v.config else None,
                                    "kernel_config": asdict(v.kernel_config) if v.kernel_config else None}
                           for v in variants}}  # fmt: skip
    present = {v.name for v in variants}
    headline = next(n for n in ("random", "random_tiers", "sparse") if n in present)

    def write(rows, text_rows, resamples=2000):
        summary, table = summarize(rows, text_rows, variants, headline_random=headline, resamples=resamples)
        result = {"name": Path(args.out).stem, "kind": "gdn-state-recall-ablation", "environment": environment(),
                  "config": config, "summary": summary, "variants": table,
                  "samples": rows, "text": text_rows}  # fmt: skip
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        if args.plot:
            plot(args.plot, table, "all-GDN recall testbed")
        done = {k: f"{v:.1f}" for k, v in summary.items() if k.endswith("_score")}
        print(f"{len(rows)} samples: {done}", flush=True)

    rows, text_rows = run(args.model, haystack, lengths=lengths, samples=args.samples, per_round=args.per_round,
        text_per_length=args.text, variants=variants, device=args.device, dtype=getattr(torch, args.dtype),
        batch_tokens=args.batch_tokens, seed=args.seed, time_budget_s=args.time_budget_s, on_round=write)  # fmt: skip
    write(rows, text_rows, DEFAULT_RESAMPLES)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
