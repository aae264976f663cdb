"""Which block-selection rule keeps the dense attention mass that RULER answers need, ranked on the CPU.

Each RULER prompt (``--samples-file``, as ``scripts/sparse_diagnostics.py`` writes it) runs once through the dense
model with the dense model's own answer appended (from a dense run's JSON, ``--dense-run``; else generated here), and
every rule of :func:`rules` is scored on the same captures (``longsparse.eval.rule_recall``): per (row kind, length,
layer, KV head) the recall of the dense mass outside the forced blocks, and how often the block of largest such mass
is chosen. ``question`` rows are the prompt's last rows (prefill), ``answer`` rows those that write the answer
(decode). Rules that need no run of their own are derived from the per-layer rows: ``*.dense2`` (the two layers
where the current rule recalls least run dense) and ``*.scaled`` (the budget doubled at 8K: the 4K rows of the base
rule, the 8K rows of ``topk40``).

    OMP_NUM_THREADS=1 python scripts/selection_recall.py --samples-file .carry/ruler_samples.json \\
        --dense-run dense.json --per-task 2 --out benchmarks/results/selection_recall.json \\
        --plot benchmarks/plots/selection_recall.png
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from longsparse import LLM
from longsparse.eval.recall import RecallTally
from longsparse.eval.rule_recall import (
    CANDIDATE_RULES,
    Prompt,
    Rule,
    candidate_config,
    plot_recall,
    recall_table,
    rule_recall,
    summarize_rules,
    weakest_layers,
    with_dense_layers,
)
from longsparse.eval.sparse_quality import ruler_samples
from longsparse.models.forecast import resolve_forecast
from longsparse.ops.sparse_attn import TRAINING_FREE
from longsparse.reports.results import environment
from longsparse.tasks.tokens import parse_length

TASKS = "niah_single_2,niah_multikey_1,niah_multivalue,vt"


SPARDA_RULES = ("current", "cmp8", "quest64", "sumpool", "topk40")
"""The candidates that apply to Forecast scores (one vector per group: no group reduction)."""


def rules(base=TRAINING_FREE) -> list[Rule]:
    """Every candidate of ``CANDIDATE_RULES`` for InfLLM-V2, those of :data:`SPARDA_RULES` for Forecast, and the
    oracle at ``base``'s budget and at ``topk40``'s."""
    out = [Rule(f"sparse.{n}", "infllmv2", candidate_config(base, n)) for n in CANDIDATE_RULES]
    out += [Rule(f"sparda.{n}", "forecast", candidate_config(base, n)) for n in SPARDA_RULES]
    out += [Rule("oracle", "oracle", base), Rule("oracle.topk40", "oracle", candidate_config(base, "topk40"))]
    return out


def derived_rows(rows: list[dict], dense_count: int = 2) -> tuple[list[dict], dict]:
    """The rules computed from others' rows: ``<mode>.dense<N>`` and ``<mode>.scaled`` (see the module docstring)."""
    out, notes = [], {}
    for mode in ("sparse", "sparda", "oracle"):
        base = "oracle" if mode == "oracle" else f"{mode}.current"
        if not any(r["rule"] == base for r in rows):
            continue
        layers = weakest_layers(rows, base, dense_count)
        notes[f"{mode}.dense{dense_count}"] = layers
        out += with_dense_layers(rows, base, layers, f"{mode}.dense{dense_count}")
        wide = "oracle.topk40" if mode == "oracle" else f"{mode}.topk40"
        out += [{**r, "rule": f"{mode}.scaled"} for r in rows if r["rule"] == base and r["length"] <= 4096]
        out += [{**r, "rule": f"{mode}.scaled"} for r in rows if r["rule"] == wide and r["length"] > 4096]
    return out, notes


def dense_answers(path: Path | None, llm, samples, tokens: int) -> dict[str, list[int]]:
    """The first ``tokens`` tokens of the dense model's answer to each sample, by sample id."""
    if path is not None:
        run = json.loads(path.read_text())
        texts = {s["id"]: s["prediction"] for s in run["samples"]}
        missing = [s.id for s in samples if s.id not in texts]
        if missing:
            raise SystemExit(f"{path} has no answer for {len(missing)} samples, e.g. {missing[0]}")
        return {s.id: llm.tokenizer.encode(texts[s.id])[:tokens] for s in samples}
    outs = llm.generate([s.prompt for s in samples], max_new_tokens=tokens, temperature=0.0)
    return {s.id: list(o.token_ids)[:tokens] for s, o in zip(samples, outs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--forecast", default="adapters/smollm2-135m-instruct", help="Forecast adapter of sparda")
    parser.add_argument("--samples-file", required=True, help="RULER samples JSON (scripts/sparse_diagnostics.py)")
    parser.add_argument("--seed", type=int, default=42, help="the samples' seed")
    parser.add_argument("--dense-run", type=Path, default=None, help="a dense RulerRun JSON holding the answers")
    parser.add_argument("--lengths", default="4k,8k")
    parser.add_argument("--tasks", default=TASKS)
    parser.add_argument("--per-task", type=int, default=2, help="samples per (task, length)")
    parser.add_argument("--answer-tokens", type=int, default=12, help="answer tokens appended (their rows: decode)")
    parser.add_argument("--question-rows", type=int, default=32, help="last prompt rows measured (prefill)")
    parser.add_argument("--rules", default="all", help="comma-separated rule names, or 'all'")
    parser.add_argument("--out", type=Path, required=True, help="result JSON")
    parser.add_argument("--plot", type=Path, default=None, help="its plot (default: --out with .png)")
    parser.add_argument("--replot", action="store_true", help="no model: draw the plot of --out again")
    args = parser.parse_args(argv)
    plot = args.plot or args.out.with_suffix(".png")
    if args.replot:
        print(plot_recall(plot, json.loads(args.out.read_text())), file=sys.stderr)
        return 0

    torch.set_grad_enabled(False)
    began = time.perf_counter()
    candidates = rules()
    if args.rules != "all":
        wanted = {n.strip() for n in args.rules.split(",") if n.strip()}
        unknown = wanted - {r.name for r in candidates}
        if unknown:
            parser.error(f"unknown rules {sorted(unknown)}; the candidates are {', '.join(r.name for r in candidates)}")
        candidates = [r for r in candidates if r.name in wanted]
    llm = LLM(args.model, dtype=torch.float32)
    projections = resolve_forecast(args.forecast, llm.config, torch.float32, llm.loaded.device)
    lengths = [parse_length(x) for x in args.lengths.split(",") if x.strip()]
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    samples = ruler_samples(llm.tokenizer, tasks, lengths, args.per_task, args.seed, args.samples_file)
    answers = dense_answers(args.dense_run, llm, samples, args.answer_tokens)
    prompts = []
    for s in samples:
        ids = llm.tokenizer.encode(s.prompt)
        prompts.append(Prompt(torch.tensor(ids + answers[s.id]), len(ids), s.target_length))
    tallies: dict = {}
    order = sorted(range(len(samples)), key=lambda i: (samples[i].index, tasks.index(samples[i].task), i))
    for done, i in enumerate(order, 1):  # every task and length early: a run cut short holds all of them
        t0 = time.perf_counter()
        found = rule_recall(llm.loaded.model, [prompts[i]], candidates, projections=projections,
                            question_rows=args.question_rows)  # fmt: skip
        for key, tally in found.items():
            tallies.setdefault(key, RecallTally()).merge(tally)
        measured = [samples[j].id for j in order[:done]]
        result = _result(args, argv, candidates, tallies, lengths, tasks, measured, began)
        write_json(args.out, result)
        print(f"{samples[i].id}: {prompts[i].ids.numel()} tokens in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    plot_recall(plot, result)
    print(f"wrote {args.out} in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    return 0


def write_json(path: Path, data) -> None:
    """``data`` as JSON, one line per row (thousands of per-head rows stay a readable, small file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    head = json.dumps({k: v for k, v in data.items() if k != "rows"}, indent=1)
    rows = ",\n".join("  " + json.dumps(row) for row in data.get("rows", []))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(head[:-2] + ',\n "rows": [\n' + rows + "\n ]\n}\n")
    tmp.replace(path)


def _result(args, argv, candidates, tallies, lengths, tasks, samples, began) -> dict:
    """The result JSON of the samples measured so far (``samples``: their ids)."""
    merged = recall_table(tallies)
    extra, dense_layers = derived_rows(merged)
    merged += extra
    return {
        "name": "selection_recall",
        "environment": environment(),
        "command": "python scripts/selection_recall.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": {
            "model": args.model,
            "forecast": args.forecast,
            "lengths": lengths,
            "tasks": tasks,
            "per_task": args.per_task,
            "answer_tokens": args.answer_tokens,
            "question_rows": args.question_rows,
            "seed": args.seed,
            "samples": len(samples),
            "sample_ids": samples,
            "threads": torch.get_num_threads(),
            "seconds": round(time.perf_counter() - began, 1),
        },  # fmt: skip
        "rules": {r.name: {"selector": r.selector, **dataclasses.asdict(r.config)} for r in candidates},
        "dense_layers": dense_layers,
        "notes": [
            "recall: chosen mass outside the forced init and local blocks over all such mass, the GQA group's heads "
            "averaged, summed over the samples' rows, per (layer, KV head); summary: mean over (layer, head)",
            "top_block_hit: share of rows whose block of largest non-forced mass is chosen",
            "question rows: the prompt's last rows (prefill); answer rows: the dense answer's rows (decode)",
            "dense<N>: the N layers where the current rule recalls least run dense (chosen on these samples)",
            "scaled: budget topk 16 at 4K and 40 at 8K (24 and 48 blocks)",
        ],
        "summary": summarize_rules(merged),
        "rows": merged,
    }


if __name__ == "__main__":
    sys.exit(main())
