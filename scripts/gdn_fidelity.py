"""SparseGDN's logit fidelity on a trained hybrid: on the same RULER prompts, how far SparseGDN's default selection and
the random-selection ablation (same tiers and per-pair budget) move every prompt position's logits from dense GDN
(longsparse.eval.fidelity). Task scores cannot separate the two once the model answers every sample under both.

    python scripts/gdn_fidelity.py --model runs/hybrid/model --length 4k --samples 3 \
        --out benchmarks/results/quality_gdn_fidelity.json --plot benchmarks/plots/quality_gdn_fidelity.png

(~1 min a prompt on a 2-core CPU; ``--resume`` adds prompts to an earlier run.) ``--model`` is an exported hybrid:
``longsparse train-hybrid --out runs/hybrid`` writes ``runs/hybrid/model`` (docs/hybrid.md). The summary's
``random_minus_sparse`` is the paired bootstrap of the relative logit error in percent, random selection's minus the
default selection's, stratified by task when tasks have several prompts.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from tqdm import tqdm

from longsparse import LLM
from longsparse.eval.fidelity import logit_fidelity
from longsparse.eval.paired import paired_bootstrap
from longsparse.ops.gdn import SparseGDNConfig
from longsparse.reports.results import environment
from longsparse.tasks.ruler import RulerGenerator
from longsparse.tasks.tokens import parse_length

TASKS = "niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,niah_multivalue,vt"
MODES = {"sparse": SparseGDNConfig(), "random": SparseGDNConfig(selection="random")}


def prompt_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """``[T, V]`` logits of every prompt position."""
    with torch.no_grad():
        return llm.runner.prefill([ids], all_logits=True).logits.float()


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [100 * r["sparse"]["relative_error"] for r in rows]
    y = [100 * r["random"]["relative_error"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(x, y, s=18)
    top = max(x + y) * 1.1
    ax.plot([0, top], [0, top], color="grey", lw=0.8, label="equal error")
    ax.set(xlim=(0, top), ylim=(0, top), xlabel="SparseGDN default selection: logit error vs dense (%)",
           ylabel="random selection, same budget (%)", title="per prompt, relative logit error")  # fmt: skip
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def summarize(rows: list[dict]) -> dict:
    """Means per mode; the paired bootstrap of random minus default relative error (percent), stratified by task
    when a task has several prompts (with one each, strata of one sample would leave nothing to resample)."""
    summary = {}
    for name in MODES:
        for key in ("relative_error", "kl", "top1_agreement"):
            summary[f"{name}_{key}"] = statistics.fmean(r[name][key] for r in rows)
    summary["random_over_sparse_error"] = summary["random_relative_error"] / summary["sparse_relative_error"]
    summary["random_worse_prompts"] = sum(r["random"]["relative_error"] > r["sparse"]["relative_error"] for r in rows)
    tasks = [r["task"] for r in rows]
    errors = {name: [r[name]["relative_error"] for r in rows] for name in MODES}
    diff = paired_bootstrap(errors["sparse"], errors["random"], tasks if len(set(tasks)) < len(tasks) else None)
    summary["random_minus_sparse"] = {k: diff.as_dict()[k] for k in ("difference", "low", "high", "samples")}
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/hybrid/model")
    parser.add_argument("--tasks", default=TASKS)
    parser.add_argument("--length", default="4k", help="target prompt length (K = 1024)")
    parser.add_argument("--samples", type=int, default=1, help="samples per task")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", required=True)
    parser.add_argument("--plot", required=True)
    parser.add_argument("--resummarize", action="store_true", help="recompute --out's summary and plot from its rows")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep --out's rows (same model, length, seed) and run only the prompts it lacks",
    )
    args = parser.parse_args(argv)
    if args.resummarize:
        result = json.loads(Path(args.out).read_text())
        result["summary"] = summarize(result["samples"])
        return finish(result, args)
    length = parse_length(args.length)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    dense = LLM(args.model, gdn="dense", device=args.device)
    sparse = {
        name: LLM(args.model, gdn="sparse", sparse_gdn_config=cfg, device=args.device) for name, cfg in MODES.items()
    }
    generator = RulerGenerator(dense.tokenizer, seed=args.seed)
    samples = [generator.sample(t, length, i) for t in tasks for i in range(args.samples)]
    done = {}
    if args.resume and Path(args.out).is_file():
        old = json.loads(Path(args.out).read_text())
        same = {k: old["config"][k] for k in ("model", "length", "seed")} == {
            "model": args.model, "length": length, "seed": args.seed}  # fmt: skip
        if not same:
            raise SystemExit(f"--resume: {args.out} holds another model, length or seed ({old['config']})")
        done = {r["id"]: r for r in old["samples"]}
    rows = [done[s.id] for s in samples if s.id in done]
    for sample in tqdm([s for s in samples if s.id not in done], desc="fidelity", unit="prompt"):
        ids = dense.tokenizer.encode(sample.prompt)
        ref = prompt_logits(dense, ids)
        row = {"id": sample.id, "task": sample.task, "prompt_tokens": len(ids)}
        for name, llm in sparse.items():
            row[name] = logit_fidelity(ref, prompt_logits(llm, ids)).as_dict()
        rows.append(row)
    summary = summarize(rows)
    result = {"name": "quality_gdn_fidelity", "kind": "gdn_fidelity", "environment": environment(),
              "config": {"model": args.model, "tasks": tasks, "length": length, "samples_per_task": args.samples,
                         "seed": args.seed, "device": str(dense.loaded.device), "dtype": str(dense.loaded.dtype)},
              "summary": summary, "samples": rows}  # fmt: skip
    return finish(result, args)


def finish(result: dict, args) -> int:
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    plot(result["samples"], args.plot)
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {args.out} and {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
