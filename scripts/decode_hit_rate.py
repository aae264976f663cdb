"""Block hit rate of offloaded decode on real text: how many of a step's dynamic blocks are already in their GPU slot.

The benchmark of `longsparse bench decode` runs random weights, whose selections have no locality (hit rate ~3 % at
128K). This measures the same quantity on a trained model and real text: SmolLM2-135M-Instruct (the default model)
with ``offload="cpu"``, a prompt of ``--prompt`` tokens of a public-domain corpus, then ``--steps`` decode steps fed
the text's own next tokens (teacher forcing: the selections follow real text, not a greedy loop that may repeat
itself). Each selector runs at the same block geometry (that of the trained Forecast adapter): SparDA with the
trained adapter, InfLLM-V2 (``sparse``) and SparDA with a random adapter. The first decode step fills the empty slots
and is left out of the mean.

    PYTHONPATH=src python scripts/decode_hit_rate.py --prompt 6144 --steps 32   # -> benchmarks/results/hit_rate.json

Runs anywhere (on a CPU the block cache's "GPU" side is host memory; the hit rate does not depend on the device).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from tqdm import tqdm

from longsparse import LLM
from longsparse.bench import BenchmarkResult
from longsparse.models.forecast import ForecastProjections
from longsparse.tasks.haystack import kjv_text, shakespeare_text

ADAPTER = "adapters/smollm2-135m-instruct"
TEXTS = {"kjv": kjv_text, "shakespeare": shakespeare_text}
SELECTORS = {  # label: (attention mode, Forecast adapter)
    "sparda_trained": ("sparda", ADAPTER),
    "sparse_infllmv2": ("sparse", None),
    "sparda_random": ("sparda", "random"),
}


def hit_rates(llm: LLM, ids: list[int], prompt: int, steps: int, label: str) -> list[float]:
    """Per decode step, the share of the step's dynamic blocks that were already resident."""
    kv, states, compressed = llm.allocate(1, len(ids) + 1)
    caches = dict(kv_cache=kv, gdn_states=states, compressed_keys=compressed)
    llm.runner.prefill([ids[:prompt]], slots=[0], **caches)
    before = kv.transfer_stats()
    rates = []
    for t in tqdm(range(steps), desc=label, unit="step"):
        llm.runner.decode([ids[prompt + t]], prefix_lens=[prompt + t], slots=[0], **caches)
        now = kv.transfer_stats()
        dynamic = now["dynamic"] - before["dynamic"]
        rates.append((now["hits"] - before["hits"]) / dynamic if dynamic else float("nan"))
        before = now
    return rates


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=6144, help="prompt tokens (the model's context is 8K)")
    parser.add_argument("--steps", type=int, default=32, help="teacher-forced decode steps")
    parser.add_argument("--data", default="shakespeare", choices=sorted(TEXTS), help="text the prompt is cut from")
    parser.add_argument("--selectors", default=",".join(SELECTORS), help=f"comma-separated, from {list(SELECTORS)}")
    parser.add_argument("--out", default="benchmarks/results", help="folder of the result file hit_rate.json")
    args = parser.parse_args(argv)
    if args.prompt <= 0 or args.steps < 2:
        parser.error("--prompt must be positive and --steps at least 2 (the first step only fills the slots)")
    labels = [s for s in args.selectors.split(",") if s]
    if unknown := set(labels) - set(SELECTORS):
        parser.error(f"unknown selectors {sorted(unknown)}; choose from {list(SELECTORS)}")
    geometry = ForecastProjections.load(ADAPTER).sparse_config  # every selector at the adapter's block geometry
    text = TEXTS[args.data]()
    result = BenchmarkResult("hit_rate")
    result.notes.append(
        f"SmolLM2-135M-Instruct (default model), offload='cpu', {args.prompt}-token {args.data} prompt, {args.steps} "
        f"teacher-forced decode steps, geometry {dataclasses.asdict(geometry)}; "
        f"hit rate = mean over steps 2-{args.steps}"
    )
    for label in labels:
        attention, forecast = SELECTORS[label]
        llm = LLM("default", attention=attention, offload="cpu", forecast=forecast, sparse_attention_config=geometry)
        start = len(text) // 2  # the middle of the corpus: away from any front matter
        ids = llm.encode(text[start : start + 8 * (args.prompt + args.steps)])[: args.prompt + args.steps]
        if len(ids) < args.prompt + args.steps:
            raise SystemExit(f"{args.data}: not enough text for {args.prompt + args.steps} tokens")
        t0 = time.perf_counter()
        rates = hit_rates(llm, ids, args.prompt, args.steps, label)
        mean = sum(rates[1:]) / (len(rates) - 1)
        result.add(selector=label, attention=attention, forecast=forecast, hit_rate=mean, per_step=rates,
                   seconds=time.perf_counter() - t0)  # fmt: skip
        result.summary[f"hit_rate_{label}"] = mean
        print(f"{label}: hit rate {mean:.3f} over steps 2-{args.steps}", flush=True)
    print(f"wrote {result.save(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
