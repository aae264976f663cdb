"""Where block-sparse attention loses RULER answers on a real model, and which selection rules win them back.

One command for a GPU; everything goes under ``--out`` as soon as it exists, so a run cut short by a time limit still
leaves its results:

* ``samples.json`` — every sample's id, task, length, prompt hash, references and needle layout (token span, KV
  blocks, offset in its block, whether it straddles a boundary, distance from the prompt's end, whether the first
  generated token's local window reaches it; ``eval.needles``);
* ``runs/<variant>.json`` — one RULER run per attention variant of the grid (``--variants``; the same samples for
  all), with the share of KV blocks each read (``attention_keep`` in decode, ``attention_prefill_keep``);
* ``summary.json`` — every run against dense: score, keep ratios, paired bootstrap difference per length and overall
  (rewritten after each run);
* ``traces.jsonl`` — ``--trace-samples`` samples per length that dense answers and a baseline sparse variant misses
  (then ones both answer), each generated again one at a time under the dense, sparse, sparda and oracle variants
  with a :class:`~longsparse.eval.selection_trace.SelectionTrace` reading every attention layer: per (layer, KV head)
  recall of the dense attention mass for InfLLM-V2, the Forecast adapter and the oracle, and at each generated token
  which layers and heads read the needle and whether each selector covered its blocks.

    python scripts/sparse_diagnostics.py --model .carry/SmolLM2-135M-Instruct.Q4_1.gguf \
        --forecast adapters/smollm2-135m-instruct --out "$OUT" --samples 16 --time-budget 480
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
from longsparse.eval.attention_variants import AttentionVariant, apply_variant
from longsparse.eval.needles import needle_layout, needle_spans
from longsparse.eval.recall import forecast_selector, infllmv2_selector, oracle_selector
from longsparse.eval.runner import prompt_sha1
from longsparse.eval.scoring import score
from longsparse.eval.selection_trace import SelectionTrace, traced_generate
from longsparse.eval.sparse_quality import keep_summary, model_tokenizer, ruler_samples, run_variant
from longsparse.models.forecast import resolve_forecast
from longsparse.ops.sparse_attn import SparseAttentionConfig
from longsparse.reports.results import environment
from longsparse.tasks.tokens import parse_length

BASE = SparseAttentionConfig(
    block_size=64, init_blocks=1, window=512, topk=16, kernel_size=32, kernel_stride=16, dense_len=0
)
"""The geometry the SmolLM2 adapters were trained for (24 blocks per query: 1 init + 9 local + 14 chosen)."""
TASKS = "niah_single_2,niah_multikey_1,niah_multivalue,vt"


def half_blocks(base: SparseAttentionConfig) -> SparseAttentionConfig:
    """The same token budget and window in blocks of half the size, compression halved too (24 blocks of 64 ->
    48 of 32, (32, 16) -> (16, 8))."""
    half = base.block_size // 2
    return dataclasses.replace(
        base,
        block_size=half,
        topk=base.budget_blocks * 2 - base.window // half,
        kernel_size=base.kernel_size // 2,
        kernel_stride=base.kernel_stride // 2,
    )


def grid(base: SparseAttentionConfig) -> dict[str, AttentionVariant]:
    """The variants, in the order they run (the most informative first, so that a time limit cuts the rest)."""
    half = half_blocks(base)
    v = [AttentionVariant("dense")]
    for mode in ("sparse", "sparda", "oracle"):
        v.append(AttentionVariant(mode, mode, base))
    for mode in ("sparse", "sparda", "oracle"):
        v.append(AttentionVariant(f"{mode}.prefill_only", mode, base, sparse_phases=("prefill",)))
        v.append(AttentionVariant(f"{mode}.decode_only", mode, base, sparse_phases=("decode",)))
    torch_path = dict(use_kernel=False)
    v += [
        AttentionVariant("sparse.neighbour1", "sparse", dataclasses.replace(base, neighbour_blocks=1), **torch_path),
        AttentionVariant("sparda.neighbour1", "sparda", dataclasses.replace(base, neighbour_blocks=1), **torch_path),
        AttentionVariant("sparse.groupmax", "sparse", dataclasses.replace(base, group_reduce="max"), **torch_path),
        AttentionVariant("sparse.halfblock", "sparse", half),
        AttentionVariant("sparda.halfblock", "sparda", half),
        AttentionVariant("oracle.halfblock", "oracle", half),
        AttentionVariant("sparse.dense0", "sparse", base, dense_layers=(0,)),
        AttentionVariant("sparda.dense0", "sparda", base, dense_layers=(0,)),
        AttentionVariant("sparse.dense01", "sparse", base, dense_layers=(0, 1)),
        AttentionVariant("sparse.topk32", "sparse", dataclasses.replace(base, topk=32)),
        AttentionVariant("sparda.topk32", "sparda", dataclasses.replace(base, topk=32)),
        AttentionVariant("oracle.topk32", "oracle", dataclasses.replace(base, topk=32)),
        AttentionVariant("oracle.topk8", "oracle", dataclasses.replace(base, topk=8)),
    ]
    return {x.name: x for x in v}


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def sample_info(llm, samples, base: SparseAttentionConfig) -> dict:
    info = {}
    for s in samples:
        spans = needle_spans(llm.tokenizer, s.prompt, s.references)
        info[s.id] = {
            "task": s.task,
            "target_length": s.target_length,
            "prompt_tokens": s.prompt_tokens,
            "prompt_sha1": prompt_sha1(s.prompt),
            "references": list(s.references),
            "depths": list(s.depths),
            "needles": [needle_layout(sp, s.prompt_tokens, base).as_dict() for sp in spans],
        }
    return info


def trace_candidates(runs: dict, samples, per_length: int, baselines=("sparse", "sparda")) -> list:
    """Samples dense answers fully and a baseline misses (by length), topped up with ones both answer."""
    dense = {r["id"]: r["score"] for r in runs["dense"].samples}
    chosen = []
    for length in sorted({s.target_length for s in samples}):
        at = [s for s in samples if s.target_length == length and dense.get(s.id) == 1.0]
        missed = [
            s
            for s in at
            if any(b in runs and next(r["score"] for r in runs[b].samples if r["id"] == s.id) < 1.0 for b in baselines)
        ]
        both = [s for s in at if s not in missed]
        chosen += (missed + both)[:per_length]
    return chosen


def run_traces(llm, forecast, samples, out: Path, tokens: int, deadline: float, base: SparseAttentionConfig) -> None:
    attention = llm.config.attention_layers
    selectors = {
        "infllmv2": infllmv2_selector(base),
        "forecast": forecast_selector(forecast, base, attention),
        "oracle": oracle_selector,
    }
    variants = [AttentionVariant("dense")] + [AttentionVariant(m, m, base) for m in ("sparse", "sparda", "oracle")]
    with (out / "traces.jsonl").open("a") as f:
        for s in samples:
            ids = llm.encode(s.prompt)
            spans = needle_spans(llm.tokenizer, s.prompt, s.references)
            needle_tokens = [t for sp in spans for t in range(sp.start, sp.end)]
            for variant in variants:
                if time.perf_counter() > deadline:
                    return
                apply_variant(llm, variant, forecast)
                trace = SelectionTrace(llm.loaded.model, selectors, base, needle_tokens)
                began = time.perf_counter()
                out_ids, fractions = traced_generate(llm, ids, tokens, trace)
                text = llm.tokenizer.decode(out_ids)
                line = {
                    "id": s.id,
                    "variant": variant.name,
                    "prediction": text,
                    "score": score(s.task, text, s.references),
                    "references": list(s.references),
                    "generated": [llm.tokenizer.decode([t]) for t in out_ids],
                    "block_fractions": fractions,
                    "needles": [needle_layout(sp, len(ids), base).as_dict() for sp in spans],
                    "seconds": time.perf_counter() - began,
                    **trace.summary(),
                }
                f.write(json.dumps(line) + "\n")
                f.flush()


def _samples(tokenizer, args) -> list:
    lengths = [parse_length(x) for x in args.lengths.split(",") if x.strip()]
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    return ruler_samples(tokenizer, tasks, lengths, args.samples, args.seed, args.samples_file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="a .gguf file, checkpoint folder or 'default'")
    parser.add_argument("--forecast", default="adapters/smollm2-135m-instruct", help="Forecast adapter folder")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--lengths", default="4k,8k")
    parser.add_argument("--tasks", default=TASKS)
    parser.add_argument("--samples", type=int, default=16, help="samples per task and length")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--samples-file",
        default=None,
        help="JSON of generated samples: read if it exists (no haystack package needed), else written",
    )
    parser.add_argument("--variants", default="all", help="comma-separated names from the grid, or 'all'")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--trace-samples", type=int, default=6, help="traced samples per length (0: none)")
    parser.add_argument("--trace-tokens", type=int, default=16, help="tokens generated per traced sample")
    parser.add_argument("--trace-after", default="sparda.decode_only", help="variant after which traces run")
    parser.add_argument("--time-budget", type=float, default=480.0, help="seconds; no new work starts after it")
    parser.add_argument(
        "--base", default="", metavar="KEY=VALUE,...", help="fields of the base geometry to change (default: adapters')"
    )
    parser.add_argument(
        "--prepare-samples", action="store_true", help="only generate --samples-file (needs the tokenizer, no model)"
    )
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    args = parser.parse_args(argv)
    began = time.perf_counter()
    deadline = began + args.time_budget
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    base = dataclasses.replace(BASE, **{k: int(v) for k, v in (x.split("=") for x in args.base.split(",") if x)})
    if args.prepare_samples:
        if not args.samples_file:
            parser.error("--prepare-samples needs --samples-file")
        samples = _samples(model_tokenizer(args.model), args)
        print(f"{len(samples)} samples in {args.samples_file}", file=sys.stderr)
        return 0
    variants = grid(base)
    if args.variants != "all":
        names = [n.strip() for n in args.variants.split(",") if n.strip()]
        unknown = [n for n in names if n not in variants]
        if unknown:
            parser.error(f"unknown variants {unknown}; the grid has {', '.join(variants)}")
        variants = {n: variants[n] for n in (["dense"] if "dense" not in names else []) + names}
    dtype = getattr(torch, args.dtype) if args.dtype else None
    llm = LLM(args.model, device=args.device, dtype=dtype)
    forecast = resolve_forecast(args.forecast, llm.config, llm.loaded.dtype, llm.loaded.device)
    samples = _samples(llm.tokenizer, args)
    write_json(out / "samples.json", sample_info(llm, samples, base))
    meta = {
        "environment": environment(),
        "arguments": vars(args),
        "base": dataclasses.asdict(base),
        "variants": {n: v.as_dict() for n, v in variants.items()},
        "device": str(llm.loaded.device),
        "dtype": str(llm.loaded.dtype),
    }
    write_json(out / "meta.json", meta)
    print(f"{len(samples)} samples ready after {time.perf_counter() - began:.0f} s", file=sys.stderr)

    runs = {}
    traced = args.trace_samples == 0
    for name, variant in variants.items():
        if time.perf_counter() > deadline:
            print(f"time budget spent: {name} and later variants not run", file=sys.stderr)
            break
        t0 = time.perf_counter()
        run = run_variant(llm, variant, samples, forecast=forecast, batch_size=args.batch_size)
        run.config["seconds"] = time.perf_counter() - t0
        runs[name] = run
        run.save(out / "runs" / f"{name}.json")
        if "dense" in runs:
            write_json(out / "summary.json", keep_summary(runs, "dense", resamples=5000))
        print(f"{name}: {run.summary()['score']:.1f} in {run.config['seconds']:.0f} s", file=sys.stderr)
        if not traced and (name == args.trace_after or name == list(variants)[-1]):
            traced = True
            chosen = trace_candidates(runs, samples, args.trace_samples)
            run_traces(llm, forecast, chosen, out, args.trace_tokens, deadline, base)
            print(f"traces of {len(chosen)} samples done at {time.perf_counter() - began:.0f} s", file=sys.stderr)
    print(f"done in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
