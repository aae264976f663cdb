"""`longsparse eval ruler ...` and `longsparse eval compare A.json B.json`.

``ruler`` loads a model through ``--backend`` (default ``longsparse:LLM``): a ``module:callable`` called as
``callable(model, gdn=..., attention=..., device=..., dtype=...)`` (plus ``sparse_gdn_config=``, ``forecast=`` and
``sparse_attention_config=`` when those options are given) that returns an object with ``.tokenizer`` and
``.generate(prompts, max_new_tokens=, temperature=, stop=)`` (``runner.Model``). Any such factory works, e.g. a
wrapper around another inference engine; the tests use it to run the command with a fake model.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from ..engine.cli import parse_sparse_attention_config, parse_sparse_gdn_config
from .haystack import CORPORA
from .paired import DEFAULT_RESAMPLES, compare_records
from .report import RulerRun, format_comparison, format_scores, load_run, parse_length, plot_scores
from .ruler import CHAT_TEMPLATES, MISSING_TASKS, TASKS, RulerGenerator
from .runner import evaluate


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="eval_command", required=True, metavar="EVAL")

    p = sub.add_parser("ruler", help="RULER synthetic tasks at several lengths", description=_RULER_HELP)
    p.add_argument("--model", default="default", help="checkpoint folder, or 'default' (default: %(default)s)")
    p.add_argument("--gdn", choices=("dense", "sparse"), default="dense", help="GDN prefill (default: %(default)s)")
    p.add_argument(
        "--attention", choices=("dense", "sparse", "sparda"), default="dense", help="attention (default: %(default)s)"
    )
    p.add_argument(
        "--forecast",
        default=None,
        help="Forecast adapter folder for --attention sparda, or 'random' (speed only: its accuracy means nothing)",
    )
    p.add_argument(
        "--sparse-attention-config",
        default=None,
        metavar="KEY=VALUE,...",
        help="geometry of sparse / sparda attention, as for `longsparse generate` (default: MiniCPM4's)",
    )
    p.add_argument(
        "--gdn-config",
        default=None,
        metavar="KEY=VALUE,...",
        help="SparseGDN settings for --gdn sparse, e.g. 'selection=random' (the random-selection ablation at the same "
        "budget) or 'tier_ratios=0.1/0.3/0.9'; fields of longsparse.ops.gdn.SparseGDNConfig (default: its defaults)",
    )
    p.add_argument("--device", default=None, help="torch device (default: the model's choice)")
    p.add_argument("--dtype", default=None, help="torch dtype name, e.g. bfloat16 (default: the model's choice)")
    p.add_argument("--lengths", default="4k,8k,16k", help="target lengths, K = 1024 (default: %(default)s)")
    p.add_argument("--tasks", default="all", help=f"comma-separated tasks or 'all' (default); {', '.join(TASKS)}")
    p.add_argument("--samples", type=int, default=100, help="samples per task and length (default: %(default)s)")
    p.add_argument("--seed", type=int, default=42, help="sample seed; equal seeds give equal prompts (default: 42)")
    p.add_argument(
        "--template", default="base", help=f"chat template: {', '.join(CHAT_TEMPLATES)} or a string with {{task}}"
    )
    p.add_argument("--haystack", choices=CORPORA, default="kjv", help="essay haystack text (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=1, help="prompts per generate() call (default: 1)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable; RULER uses none)")
    p.add_argument("--name", default=None, help="run name (default: from model, gdn and attention)")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/<name>.json); plot beside it")
    p.add_argument("--backend", default="longsparse:LLM", help="model factory module:callable (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(_eval_run=run_ruler)

    q = sub.add_parser("compare", help="paired comparison of two runs on the same samples", description=_COMPARE_HELP)
    q.add_argument("a", help="run A (the baseline), a JSON written by 'eval ruler'")
    q.add_argument("b", help="run B, on the same samples")
    q.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, help="bootstrap resamples (default: 20000)")
    q.add_argument("--confidence", type=float, default=0.95, help="interval level (default: %(default)s)")
    q.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: %(default)s)")
    q.add_argument("--out", default=None, help="also write the comparison as JSON here, and a plot beside it")
    q.set_defaults(_eval_run=run_compare)


_RULER_HELP = (
    "Generate RULER's synthetic tasks at each target length in the model's tokenizer, decode greedily with RULER's "
    "per-task generation budget, score with RULER's rules, and write a table, a JSON and a plot. The QA tasks "
    "(qa_1, qa_2) need SQuAD / HotpotQA, which are not available offline: they are skipped and listed as missing."
)
_COMPARE_HELP = (
    "B - A on the samples both runs share, with a paired bootstrap interval (resampling samples within each task "
    "and length), overall, per length and per task."
)


def run(args) -> int:
    return int(args._eval_run(args) or 0)


def run_ruler(args) -> int:
    lengths = [parse_length(x) for x in args.lengths.split(",") if x.strip()]
    tasks, missing = select_tasks(args.tasks)
    if args.samples < 1:
        raise ValueError(f"--samples must be >= 1, got {args.samples}")
    name = args.name or default_run_name(args.model, args.gdn, args.attention)
    out = Path(args.out) if args.out else Path("benchmarks/results") / f"{name}.json"

    options = {}
    if args.gdn_config is not None:
        if args.gdn != "sparse":
            raise ValueError("--gdn-config configures --gdn sparse; it was given with --gdn dense")
        options["sparse_gdn_config"] = parse_sparse_gdn_config(args.gdn_config)
    if args.forecast is not None:
        options["forecast"] = args.forecast
    if args.sparse_attention_config is not None:
        options["sparse_attention_config"] = parse_sparse_attention_config(args.sparse_attention_config)
    factory = load_factory(args.backend)
    llm = factory(
        args.model, gdn=args.gdn, attention=args.attention, device=args.device, dtype=_dtype(args.dtype), **options
    )
    generator = RulerGenerator(llm.tokenizer, seed=args.seed, template=args.template, corpus=args.haystack)
    samples = (generator.sample(task, length, i) for length in lengths for task in tasks for i in range(args.samples))
    results = evaluate(
        llm,
        samples,
        total=len(lengths) * len(tasks) * args.samples,
        batch_size=args.batch_size,
        stop=args.stop,
        progress=not args.no_progress,
        description=name,
    )
    config = {
        "model": args.model,
        "gdn": args.gdn,
        "gdn_config": args.gdn_config,
        "attention": args.attention,
        "forecast": args.forecast,
        "sparse_attention_config": args.sparse_attention_config,
        "device": args.device,
        "dtype": args.dtype,
        "backend": args.backend,
        "lengths": lengths,
        "tasks": tasks,
        "samples_per_task": args.samples,
        "seed": args.seed,
        "template": args.template,
        "haystack": args.haystack,
        "batch_size": args.batch_size,
        "stop": args.stop,
        "temperature": 0.0,
        "max_new_tokens": {t: TASKS[t].max_new_tokens for t in tasks},
    }
    run_ = RulerRun.from_results(name, config, results, missing)
    path = run_.save(out)
    plot = plot_scores(path.with_suffix(".png"), {name: run_})
    print(format_scores(run_))
    print(f"wrote {path} and {plot}")
    return 0


def run_compare(args) -> int:
    a, b = load_run(args.a), load_run(args.b)
    label_a, label_b = (a.name, b.name) if a.name != b.name else ("A", "B")
    comparison = compare_records(
        a.samples, b.samples, resamples=args.resamples, confidence=args.confidence, seed=args.seed
    )
    print(format_comparison(comparison, label_a, label_b))
    if args.out:
        import json

        from ..bench.results import environment

        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "name": out.stem,
            "kind": "ruler-compare",
            "environment": environment(),
            "a": {"path": str(args.a), "name": a.name, "config": a.config},
            "b": {"path": str(args.b), "name": b.name, "config": b.config},
            "summary": comparison.overall.as_dict(),
            **comparison.as_dict(),
            "bootstrap": {"resamples": args.resamples, "confidence": args.confidence, "seed": args.seed},
        }
        out.write_text(json.dumps(data, indent=1) + "\n")
        plot = plot_scores(out.with_suffix(".png"), {label_a: a, label_b: b})
        print(f"wrote {out} and {plot}")
    return 0


def select_tasks(spec: str) -> tuple[list[str], dict[str, str]]:
    """Tasks to run and the requested tasks that cannot run here (with the reason), from ``--tasks``."""
    names = list(TASKS) + list(MISSING_TASKS) if spec.strip() == "all" else [t.strip() for t in spec.split(",")]
    names = [t for t in dict.fromkeys(names) if t]
    unknown = [t for t in names if t not in TASKS and t not in MISSING_TASKS]
    if unknown or not names:
        raise ValueError(f"--tasks: unknown {unknown or spec!r}; choose from {', '.join((*TASKS, *MISSING_TASKS))}")
    missing = {t: MISSING_TASKS[t] for t in names if t in MISSING_TASKS}
    for t, reason in missing.items():
        print(f"skipping {t}: {reason}", file=sys.stderr)
    tasks = [t for t in names if t in TASKS]
    if not tasks:
        raise ValueError("--tasks: none of the requested tasks can run offline")
    return tasks, missing


def default_run_name(model: str, gdn: str, attention: str) -> str:
    stem = Path(model).name or "model"
    return f"ruler-{stem}-gdn_{gdn}-attn_{attention}"


def load_factory(spec: str):
    """The callable named by ``module:attribute``."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"--backend must look like module:callable, got {spec!r}")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--backend {spec!r} cannot be loaded: {exc}") from exc
    if not callable(factory):
        raise ValueError(f"--backend {spec!r} is not callable")
    return factory


def _dtype(name: str | None):
    if name is None:
        return None
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"--dtype must name a torch dtype (e.g. bfloat16), got {name!r}")
    return dtype
