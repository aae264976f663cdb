"""`longsparse eval ruler ...`, `longsparse eval compare A.json B.json`, `longsparse eval recall ...` and
`longsparse eval traces ...`.

``ruler`` loads a model through ``--backend`` (default ``longsparse:LLM``): a ``module:callable`` called as
``callable(model, gdn=..., attention=..., device=..., dtype=...)`` (plus ``sparse_gdn_config=``, ``forecast=`` and
``sparse_attention_config=`` when those options are given) that returns an object with ``.tokenizer`` and
``.generate(prompts, max_new_tokens=, temperature=, stop=)`` (``runner.Model``). Any such factory works, e.g. a
wrapper around another inference engine; the tests use it to run the command with a fake model.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from ..cli_args import (
    DEVICE_HELP,
    DTYPES,
    add_compute_options,
    add_device_dtype,
    device_name,
    parse_sparse_attention_config,
    parse_sparse_gdn_config,
    positive_int,
    probability,
    torch_threads,
)
from ..models.modes import ATTENTION_MODES, GDN_MODES
from ..tasks.haystack import CORPORA
from ..tasks.ruler import CHAT_TEMPLATES, MISSING_TASKS, TASKS, RulerGenerator
from ..tasks.tokens import parse_length
from .paired import DEFAULT_RESAMPLES, compare_records
from .report import RulerRun, format_comparison, format_scores, load_run, plot_scores
from .runner import evaluate


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="eval_command", required=True, metavar="EVAL")

    p = sub.add_parser("ruler", help="RULER synthetic tasks at several lengths", description=_RULER_HELP)
    p.add_argument("--model", default="default", help="checkpoint folder, or 'default' (default: %(default)s)")
    p.add_argument("--gdn", choices=GDN_MODES, default="dense", help="GDN prefill (default: %(default)s)")
    p.add_argument("--attention", choices=ATTENTION_MODES, default="dense", help="attention (default: %(default)s)")
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
    p.add_argument("--device", type=device_name, default=None, help=f"{DEVICE_HELP} (default: the model's choice)")
    p.add_argument("--dtype", choices=DTYPES[1:], default=None, help="model dtype (default: the model's choice)")
    p.add_argument(
        "--lengths",
        default="4k,8k",
        help="target lengths (prompt + generation budget), K = 1024; each at most the model's context "
        "(default: %(default)s)",
    )
    p.add_argument("--tasks", default="all", help=f"comma-separated tasks or 'all' (default); {', '.join(TASKS)}")
    p.add_argument(
        "--samples", type=positive_int, default=100, help="samples per task and length (default: %(default)s)"
    )
    p.add_argument("--seed", type=int, default=42, help="sample seed; equal seeds give equal prompts (default: 42)")
    p.add_argument(
        "--template", default="base", help=f"chat template: {', '.join(CHAT_TEMPLATES)} or a string with {{task}}"
    )
    p.add_argument("--haystack", choices=CORPORA, default="kjv", help="essay haystack text (default: %(default)s)")
    p.add_argument("--batch-size", type=positive_int, default=1, help="prompts per generate() call (default: 1)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable; RULER uses none)")
    p.add_argument("--name", default=None, help="run name (default: from model, gdn and attention)")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/<name>.json); plot beside it")
    p.add_argument("--backend", default="longsparse:LLM", help="model factory module:callable (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_compute_options(p)
    p.set_defaults(_eval_run=run_ruler)

    q = sub.add_parser("compare", help="paired comparison of two runs on the same samples", description=_COMPARE_HELP)
    q.add_argument("a", help="run A (the baseline), a JSON written by 'eval ruler'")
    q.add_argument("b", help="run B, on the same samples")
    q.add_argument(
        "--resamples", type=positive_int, default=DEFAULT_RESAMPLES, help="bootstrap resamples (default: 20000)"
    )
    q.add_argument("--confidence", type=float, default=0.95, help="interval level (default: %(default)s)")
    q.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: %(default)s)")
    q.add_argument("--out", default=None, help="also write the comparison as JSON here, and a plot beside it")
    q.set_defaults(_eval_run=run_compare)

    r = sub.add_parser(
        "recall", help="block-selection recall of Forecast adapters vs InfLLM-V2", description=_RECALL_HELP
    )
    r.add_argument("--model", default="default", help="checkpoint folder, .gguf file or 'default' (SmolLM2-135M)")
    r.add_argument(
        "--adapter", action="append", default=[], metavar="NAME=PATH", help="a Forecast adapter to measure (repeat)"
    )
    r.add_argument("--untrained", action="store_true", help="also the untrained forecast (next layer's mean query)")
    r.add_argument("--random", action="store_true", help="also a random forecast (seeded N(0, 1/hidden) weights)")
    r.add_argument("--data", default="shakespeare", help="kjv, shakespeare, a text file or .npy token ids")
    r.add_argument("--lengths", default="4k,8k", help="sequence lengths, K = 1024 (default: %(default)s)")
    r.add_argument("--sequences", type=positive_int, default=2, help="sequences per length (default: %(default)s)")
    r.add_argument(
        "--positions", type=positive_int, default=128, help="query positions per sequence (default: %(default)s)"
    )
    r.add_argument("--tail", type=probability, default=0.25, help="positions from this last fraction (default: 0.25)")
    r.add_argument("--seed", type=int, default=0, help="draw seed of sequences and positions")
    r.add_argument("--window", type=positive_int, default=None, help="local window (default: the adapters' geometry)")
    r.add_argument("--topk", type=positive_int, default=None, help="blocks beyond the window (default: the adapters')")
    add_device_dtype(r)
    r.add_argument("--out", default="benchmarks/results/forecast.json", help="result JSON (default: %(default)s)")
    add_compute_options(r)
    r.set_defaults(_eval_run=run_recall)
    _configure_keep_curve(sub)

    t = sub.add_parser("traces", help="selection traces of decode on real text", description=_TRACES_HELP)
    t.add_argument("--model", default="default", help="checkpoint folder, .gguf file or 'default' (SmolLM2-135M)")
    t.add_argument("--adapter", default="adapters/smollm2-135m-instruct", help="trained Forecast adapter folder")
    t.add_argument("--random", action="store_true", help="also SparDA with a random adapter")
    t.add_argument("--data", choices=CORPORA, default="shakespeare", help="text (default: %(default)s)")
    t.add_argument("--contexts", default="2048,4096,7936", help="prompt lengths in tokens (default: %(default)s)")
    t.add_argument("--steps", type=int, default=256, help="teacher-forced decode steps (default: %(default)s)")
    t.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    t.add_argument("--out", default="benchmarks/traces/selections.npz", help="trace file (default: %(default)s)")
    t.set_defaults(_eval_run=run_traces)


_RULER_HELP = (
    "Generate RULER's synthetic tasks at each target length in the model's tokenizer, decode greedily with RULER's "
    "per-task generation budget, score with RULER's rules, and write a table, a JSON and a plot. The QA tasks "
    "(qa_1, qa_2) need SQuAD / HotpotQA, which are not available offline: they are skipped and listed as missing."
)
_COMPARE_HELP = (
    "B - A on the samples both runs share, with a paired bootstrap interval (resampling samples within each task "
    "and length), overall, per length and per task."
)


_RECALL_HELP = (
    "Run the model densely on held-out text and measure, at every attention layer, the share of the dense attention "
    "mass that each selector's blocks keep (InfLLM-V2, the given Forecast adapters, optionally the untrained and a "
    "random forecast, and the oracle). Writes a JSON with per-layer rows and summary keys recall_<name>."
)


def _configure_keep_curve(sub) -> None:
    k = sub.add_parser(
        "keep-curve", help="accuracy vs keep ratio: dense, oracle, sparse, sparda at several budgets",
        description=_KEEP_CURVE_HELP,
    )  # fmt: skip
    k.add_argument("--model", default="default", help="checkpoint folder, .gguf file or 'default' (SmolLM2-135M)")
    k.add_argument("--forecast", default=None, help="Forecast adapter folder for sparda (default: none, no sparda)")
    k.add_argument("--modes", default="dense,oracle,sparse,sparda", help="modes (default: %(default)s)")
    k.add_argument(
        "--topk", default="8,16,24,32", help="budgets: SparseAttentionConfig.topk values (default: %(default)s)"
    )
    k.add_argument(
        "--geometry", default="", metavar="KEY=VALUE,...",
        help="fields of SparseAttentionConfig changed from the model's default block-sparse geometry",
    )  # fmt: skip
    k.add_argument(
        "--summary-topk", type=int, default=None, help="budget of the summary keys (default: the geometry's)"
    )
    k.add_argument("--lengths", default="4k,8k", help="target lengths, K = 1024 (default: %(default)s)")
    k.add_argument("--tasks", default="niah_single_2,niah_multikey_1,niah_multivalue,vt", help="RULER tasks")
    k.add_argument("--samples", type=int, default=40, help="samples per task and length (default: %(default)s)")
    k.add_argument("--seed", type=int, default=42, help="sample seed (default: %(default)s)")
    k.add_argument("--samples-file", default=None, help="JSON of the samples: read if it exists, else written")
    k.add_argument("--batch-size", type=int, default=32, help="prompts per generate() call (default: %(default)s)")
    k.add_argument("--runs-dir", default="benchmarks/results/keep_curve", help="one run JSON per (mode, budget); "
                   "runs already there are kept, not run again (default: %(default)s)")  # fmt: skip
    k.add_argument("--summarize-only", action="store_true", help="no model: the result from the runs already there")
    k.add_argument("--time-budget", type=float, default=None, help="seconds; no new run starts after it")
    k.add_argument("--device", default=None, help="torch device (default: the model's choice)")
    k.add_argument("--dtype", default=None, help="torch dtype name (default: the model's choice)")
    k.add_argument("--out", default="benchmarks/results/quality_attn.json", help="result JSON; the plot beside it")
    k.set_defaults(_eval_run=run_keep_curve)


_KEEP_CURVE_HELP = (
    "Run dense, the oracle (the blocks of largest dense attention mass: the bound at each budget), InfLLM-V2 "
    "(sparse) and SparDA at several budgets on the same RULER samples (greedy), and write each mode's score against "
    "its keep ratio (KV blocks a decode step reads / causal blocks) per length, with paired bootstrap intervals "
    "against dense, as JSON and a plot. The summary keys hold the scores at --summary-topk."
)


def run_keep_curve(args) -> int:
    import time

    from ..reports.results import environment
    from .keep_curve import curve_result, curve_variants, plot_curve, run_name
    from .report import load_run

    began = time.perf_counter()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    topks = [int(x) for x in args.topk.split(",") if x.strip()]
    runs_dir = Path(args.runs_dir)
    runs = {p.stem: load_run(p) for p in sorted(runs_dir.glob("*.json"))} if runs_dir.is_dir() else {}
    base = None
    if not args.summarize_only:
        llm, forecast, base = _keep_curve_model(args, modes)
        lengths = [parse_length(x) for x in args.lengths.split(",") if x.strip()]
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        from .sparse_quality import ruler_samples, run_variant

        samples = ruler_samples(llm.tokenizer, tasks, lengths, args.samples, args.seed, args.samples_file)
        for variant in curve_variants(modes, topks, base):
            if variant.name in runs:
                continue
            if args.time_budget is not None and time.perf_counter() - began > args.time_budget:
                print(f"time budget spent: {variant.name} and later runs not started", file=sys.stderr)
                break
            run_ = run_variant(llm, variant, samples, forecast=forecast, batch_size=args.batch_size, progress=True)
            runs[variant.name] = run_
            run_.save(runs_dir / f"{variant.name}.json")
    summary_topk = args.summary_topk or (base.topk if base is not None else topks[0])
    wanted = {"dense"} | {run_name(m, k) for m in modes if m != "dense" for k in topks}
    result = curve_result({n: r for n, r in runs.items() if n in wanted}, summary_topk)
    out = Path(args.out)
    arguments = {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, list, type(None)))}
    data = {"name": out.stem, "kind": "keep-curve", "environment": environment(), "arguments": arguments, **result}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    plot = plot_curve(out.with_suffix(".png"), result)
    s = result["summary"]
    print("  ".join(f"{k} {v:.1f}" for k, v in s.items() if k.endswith("_score")) + f"  keep ratio {s['keep_ratio']}")
    print(f"wrote {out} and {plot}")
    return 0


def _keep_curve_model(args, modes):
    """The LLM, its Forecast adapter (None without sparda) and the base geometry of a keep-curve run."""
    import dataclasses

    from ..engine import LLM
    from ..models.forecast import resolve_forecast
    from ..models.modes import default_sparse_attention_config

    if "sparda" in modes and not args.forecast:
        raise ValueError("--modes sparda needs --forecast (a Forecast adapter folder)")
    llm = LLM(args.model, device=args.device, dtype=_dtype(args.dtype))
    forecast = None
    if "sparda" in modes:
        forecast = resolve_forecast(args.forecast, llm.config, llm.loaded.dtype, llm.loaded.device)
    trained = forecast.sparse_config if forecast is not None else None
    base = default_sparse_attention_config(llm.config.architecture, trained)
    changes = {}
    for item in filter(None, (x.strip() for x in args.geometry.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--geometry: {item!r} is not KEY=VALUE")
        changes[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
    return llm, forecast, dataclasses.replace(base, **changes)


_TRACES_HELP = (
    "Prefill a prompt of each length (densely) from the middle of a public-domain text, then decode the text's own "
    "next tokens with SparDA (the trained adapter) and InfLLM-V2, recording the KV blocks every attention layer and "
    "KV head reads at each step (longsparse.engine.traces); `longsparse bench locality` analyses the file."
)


def run(args) -> int:
    if not hasattr(args, "threads"):
        return int(args._eval_run(args) or 0)
    with torch_threads(args.threads):
        return int(args._eval_run(args) or 0)


def run_traces(args) -> int:
    import torch
    from tqdm import tqdm

    from ..engine.traces import record_selections, save_traces
    from ..models import load_model
    from ..models.forecast import ForecastProjections
    from ..tasks.haystack import kjv_text, shakespeare_text

    torch.set_num_threads(args.threads)
    contexts = [parse_length(x) for x in args.contexts.split(",") if x.strip()]
    loaded = load_model(args.model, dtype="float32", device="cpu")
    adapter = ForecastProjections.load(args.adapter, device=loaded.device, dtype=loaded.dtype)
    adapter.check_model(loaded.config)
    if adapter.sparse_config is None:
        raise ValueError(f"{args.adapter}: the adapter records no selection geometry")
    modes = {"sparda_trained": ("sparda_gpu", adapter), "sparse_infllmv2": ("sparse_gpu", None)}
    if args.random:
        modes["sparda_random"] = ("sparda_gpu", ForecastProjections.random(loaded.config, seed=0))
    text = {"kjv": kjv_text, "shakespeare": shakespeare_text}[args.data]()
    start = len(text) // 2  # the middle of the corpus: away from any front matter
    need = max(contexts) + args.steps
    ids = loaded.tokenizer.encode(text[start : start + 8 * need])[:need]
    if len(ids) < need:
        raise ValueError(f"{args.data}: not enough text for {need} tokens")
    traces = []
    for context in contexts:
        traces += record_selections(loaded.model, ids, context, args.steps, modes, adapter.sparse_config, progress=tqdm)
        print(f"wrote {save_traces(args.out, traces)} ({len(traces)} traces)", flush=True)  # partial results kept
    return 0


def run_recall(args) -> int:
    import dataclasses
    import time

    import numpy as np
    import torch

    from ..models import load_model
    from ..models.forecast import ForecastProjections, init_from_queries
    from ..ops.sparse_attn import TRAINING_FREE
    from ..reports.results import BenchmarkResult
    from ..tasks.streams import draw_sequence, load_token_stream
    from .recall import (
        RecallSetup,
        forecast_selector,
        infllmv2_selector,
        oracle_selector,
        query_positions,
        recall_rows,
        selection_recall,
        summarize,
    )

    setup = RecallSetup(
        lengths=tuple(parse_length(x) for x in args.lengths.split(",") if x.strip()),
        sequences=args.sequences,
        positions=args.positions,
        tail=args.tail,
        seed=args.seed,
    )
    loaded = load_model(args.model, dtype=args.dtype, device=args.device)
    model, device = loaded.model, loaded.device
    adapters: dict[str, ForecastProjections] = {}
    for spec in args.adapter:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--adapter must look like NAME=PATH, got {spec!r}")
        projections = ForecastProjections.load(path, device=device, dtype=torch.float32)
        projections.check_model(loaded.config)
        adapters[name] = projections
    geometries = {p.sparse_config for p in adapters.values()}
    if len(geometries) > 1:
        raise ValueError(f"the adapters were trained for different selection geometries: {geometries}")
    sparse = TRAINING_FREE  # the geometry Forecast training defaults to (train.SHORT_CONTEXT_SPARSE)
    if adapters and next(iter(adapters.values())).sparse_config is not None:
        sparse = next(iter(adapters.values())).sparse_config
    changes = {k: v for k, v in (("window", args.window), ("topk", args.topk)) if v is not None}
    sparse = dataclasses.replace(sparse, **changes)

    selectors = {"infllmv2": infllmv2_selector(sparse)}
    attention = loaded.config.attention_layers
    selectors.update({name: forecast_selector(p, sparse, attention) for name, p in adapters.items()})
    if args.untrained:
        untrained = ForecastProjections.for_model(loaded.config, loaded.source.name)
        init_from_queries(untrained, model)
        selectors["untrained"] = forecast_selector(untrained.to(device), sparse, attention)
    if args.random:
        random = ForecastProjections.random(loaded.config, seed=args.seed)
        selectors["random"] = forecast_selector(random.to(device), sparse, attention)
    selectors["oracle"] = oracle_selector

    stream = load_token_stream(args.data, loaded.tokenizer, loaded.config.vocab_size)
    rows = []
    for length in setup.lengths:
        began = time.perf_counter()
        seqs, positions = [], []
        for index in range(setup.sequences):
            rng = np.random.default_rng([setup.seed, length, index])
            seqs.append(draw_sequence(stream, length, rng))
            positions.append(query_positions(length, setup.positions, setup.tail, rng))
        rows += recall_rows(selection_recall(model, seqs, positions, selectors, sparse), length)
        print(f"length {length}: {setup.sequences} sequences in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    names = list(selectors)
    out = Path(args.out)
    result = BenchmarkResult(out.stem, rows=rows, summary=summarize(rows, names))
    result.notes += [
        f"model {loaded.source.name} ({loaded.dtype}, {device}); held-out data {stream.name!r}, {len(stream)} tokens",
        f"setup {dataclasses.asdict(setup)}; selection geometry {dataclasses.asdict(sparse)}",
        "recall: chosen non-forced mass / all non-forced mass (init and local blocks excluded); "
        "recall_with_forced: selected mass / total; dense mass = the GQA group's heads averaged; per layer, then "
        "averaged over layers (and lengths for the headline keys)",
        "adapters: " + ", ".join(f"{n}={s.split('=', 1)[1]}" for n, s in zip(adapters, args.adapter)),
    ]
    path = result.save(out.parent)
    width = max(len(n) for n in names)
    for name in names:
        per_length = "  ".join(f"{n}: {result.summary[f'recall_{name}_{n}']:.3f}" for n in setup.lengths)
        print(f"{name:<{width}}  recall {result.summary[f'recall_{name}']:.3f}  ({per_length})")
    print(f"wrote {path}")
    return 0


def run_ruler(args) -> int:
    lengths = [parse_length(x) for x in args.lengths.split(",") if x.strip()]
    tasks, missing = select_tasks(args.tasks)
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
    check_lengths(lengths, getattr(getattr(llm, "config", None), "max_position_embeddings", None))
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
        from ..reports.results import environment

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


def check_lengths(lengths: list[int], context: int | None) -> None:
    """ValueError naming the target lengths beyond the model's context (``None``: a backend that does not say)."""
    longer = [n for n in lengths if context is not None and n > context]
    if longer:
        raise ValueError(
            f"--lengths: {', '.join(f'{n:,}' for n in longer)} tokens exceed the model's context of {context:,} tokens"
        )


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
    """A ``--dtype`` choice as a torch dtype (None: the model's choice)."""
    if name is None:
        return None
    import torch

    return getattr(torch, name)
