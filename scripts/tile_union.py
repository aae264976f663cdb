"""Work the block-sparse prefill kernel does beyond the selections: the tile-union overhead, on real activations.

The kernel of ``ops/sparse_attn/kernels/prefill.py`` gives each program ``BT`` consecutive query tokens of one KV
head and walks the union of their selected blocks, masking each row to its own selection. Its work is therefore
``Σ_tiles |union| · BT`` (token, block) visits against the ``Σ_tokens |selection|`` the selections need; the ratio
is the overhead. ``BT`` is set by the group size (``default_tile_tokens``: 4 tokens for MiniCPM4's 16 query heads per
KV head, 16 for Qwen3.5's 4), and the union is small only if neighbouring tokens select alike.

This measures the ratio for every tile size on a trained model reading real text — SmolLM2-135M-Instruct (the
default model; 3 query heads per KV head, like Qwen3.5's tiles of 16) with InfLLM-V2 selection from its own queries
and keys at every attention layer — and, as the baseline of the random-weight benchmarks, on i.i.d. normal queries
and keys of the same shapes.

    PYTHONPATH=src python scripts/tile_union.py --tokens 6144   # -> benchmarks/results/tile_union.json, plot
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from tqdm import tqdm

from longsparse import LLM
from longsparse.bench import BenchmarkResult
from longsparse.models.capture import capture_attention
from longsparse.models.forecast import ForecastProjections
from longsparse.ops.sparse_attn import build_tile_plan
from longsparse.ops.sparse_attn.naive import compress_keys_ref, infllmv2_select_ref
from longsparse.reports.plot import panel_plot
from longsparse.tasks.haystack import kjv_text, shakespeare_text

ADAPTER = "adapters/smollm2-135m-instruct"
TEXTS = {"kjv": kjv_text, "shakespeare": shakespeare_text}
TILES = (1, 2, 4, 8, 16)


def overheads(q: torch.Tensor, k: torch.Tensor, config) -> dict[int, float]:
    """``q [T, Hq, d]``, ``k [T, Hkv, d]`` of one layer -> {tile tokens: visited / needed (token, block) pairs}."""
    T = q.shape[0]
    k_cmp, _ = compress_keys_ref(k[None].double(), config.kernel_size, config.kernel_stride)
    idx = infllmv2_select_ref(q[None].double(), k_cmp, config)  # [1, T, Hkv, S]
    needed = int((idx >= 0).sum())
    out = {}
    for bt in TILES:
        plan = build_tile_plan(idx, bt, config.num_blocks(T))
        visited = int(plan.counts.sum()) * bt  # the last tile's padding rows are masked, not visited: ≤ 1 tile
        out[bt] = visited / needed
    return out


def draw(result: BenchmarkResult, path: str, tokens: int):
    """Overhead against tile size: the mean of the trained model and of the random baseline, and a few layers."""
    layers = sorted({r["layer"] for r in result.rows})
    overhead = {(r["source"], r["layer"], r["tile_tokens"]): r["overhead"] for r in result.rows}
    panels = {
        "mean over layers": {
            source: [result.summary[f"overhead_{source}_bt{bt}"] for bt in TILES] for source in ("trained", "random")
        },
        "per layer (trained)": {
            f"layer {layer}": [overhead[("trained", layer, bt)] for bt in TILES]
            for layer in layers[:: max(1, len(layers) // 6)]
        },
    }
    title = f"Block-sparse prefill: visited / needed (token, block) pairs, SmolLM2-135M, {tokens} tokens"
    return panel_plot(path, list(TILES), panels, title=title, xlabel="query tokens per tile (BT)", ylabel="overhead")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=6144, help="prompt tokens (the model's context is 8K)")
    parser.add_argument("--data", default="shakespeare", choices=sorted(TEXTS))
    parser.add_argument("--out", default="benchmarks", help="folder holding results/ and plots/")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random baseline")
    parser.add_argument("--topk", type=int, default=None, help="override the adapter geometry's topk")
    parser.add_argument("--window", type=int, default=None, help="override the adapter geometry's local window")
    parser.add_argument("--name", default="tile_union", help="result and plot name (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.tokens <= 0:
        parser.error("--tokens must be positive")
    config = ForecastProjections.load(ADAPTER).sparse_config  # the block geometry the model's adapter was trained at
    overrides = {k: v for k, v in (("topk", args.topk), ("window", args.window)) if v is not None}
    config = dataclasses.replace(config, dense_len=0, **overrides)  # every row selects, as in a long prefill
    llm = LLM("default")
    text = TEXTS[args.data]()
    start = len(text) // 2
    ids = llm.encode(text[start : start + 8 * args.tokens])[: args.tokens]
    if len(ids) < args.tokens:
        raise SystemExit(f"{args.data}: not enough text for {args.tokens} tokens")
    T = len(ids)
    captures = capture_attention(llm.loaded.model, torch.tensor(ids), torch.arange(T))
    gen = torch.Generator().manual_seed(args.seed)
    result = BenchmarkResult(args.name)
    result.notes.append(
        f"SmolLM2-135M-Instruct, {T}-token {args.data} prompt, InfLLM-V2 selection (float64 reference) at every "
        f"attention layer, geometry {dataclasses.asdict(config)}; overhead = Σ_tiles |union|·BT / Σ_tokens "
        "|selection|; random = i.i.d. N(0, 1) queries and keys of the same shapes"
    )
    for layer, cap in tqdm(sorted(captures.items()), desc="layers", unit="layer"):
        real = overheads(cap.q.float(), cap.k.float(), config)
        rand = overheads(torch.randn(cap.q.shape, generator=gen), torch.randn(cap.k.shape, generator=gen), config)
        for source, values in (("trained", real), ("random", rand)):
            for bt, value in values.items():
                result.add(source=source, layer=layer, tile_tokens=bt, overhead=value)
    for source in ("trained", "random"):
        for bt in TILES:
            vals = [r["overhead"] for r in result.rows if r["source"] == source and r["tile_tokens"] == bt]
            result.summary[f"overhead_{source}_bt{bt}"] = sum(vals) / len(vals)
    print({k: round(v, 3) for k, v in result.summary.items()})
    path = result.save(f"{args.out}/results")
    plot = draw(result, f"{args.out}/plots/{args.name}.png", T)
    print(f"wrote {path}, {plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
