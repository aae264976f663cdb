"""The figures that README.md and benchmarks/BENCHMARKS.md quote, rendered from the results JSON.

Each quoting document holds its rendered blocks between ``<!-- figures:<block>:begin -->`` and
``<!-- figures:<block>:end -->`` lines; :func:`sync` rewrites them from ``benchmarks/results/*.json`` and, with
``check``, reports the blocks that disagree with the JSON instead (the test suite runs that check, so that no figure
is copied by hand). Blocks: ``where-it-stands`` (README) and one headline table per benchmark (``gdn_core``,
``model``, ``sparse_attn``, ``serve``: BENCHMARKS.md). A figure's JSON is the summary its run wrote (``summary``),
plus, for the run's device and tree and the checks, its rows and environment.

    python -m longsparse.bench.figures            # rewrite the blocks after a run
    python -m longsparse.bench.figures --check    # exit 1 and name the blocks that disagree
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "benchmarks" / "results"
DOCUMENTS = {
    "README.md": ("where-it-stands",),
    "benchmarks/BENCHMARKS.md": ("gdn_core", "model", "sparse_attn", "serve"),
}
"""Which blocks each document (relative to the repository root) holds."""
WIDTH = 120
"""Prose is wrapped to the documents' line length."""


@dataclass(frozen=True)
class Figure:
    """One summary key of a results file: what it means, its target (``">="`` / ``"<="`` / ``">"`` a bound, or no
    target) and, for ``bench gdn``'s keys, the length of the B = 1 row it comes from (whose check it needs)."""

    key: str
    meaning: str
    op: str | None = None
    bound: float | None = None
    length: int | None = None

    def status(self, value, checked: bool = True) -> str:
        if value is None:
            return "not measured"
        if not checked:
            return "not checked at that length"
        if self.op is None:
            return "—"
        met = {">=": value >= self.bound, "<=": value <= self.bound, ">": value > self.bound}[self.op]
        return "met" if met else "missed"

    @property
    def target(self) -> str:
        return "—" if self.op is None else f"{self.op.replace('>=', '≥').replace('<=', '≤')} {self.bound:g}"


K128, K32, K4 = 131072, 32768, 4096
TABLES: dict[str, list[Figure]] = {
    "gdn_core": [
        Figure("speedup_vs_best_dense_128k", "fastest dense kernel (checked) / ours, 128K", ">=", 1.3, K128),
        Figure("speedup_vs_flashqla_128k", "FlashQLA / ours, 128K", ">=", 1.3, K128),
        Figure("speedup_vs_flashqla_32k", "FlashQLA / ours, 32K", ">", 1.0, K32),
        Figure("speedup_vs_flashinfer_128k", "FlashInfer (CuTe DSL) / ours, 128K", length=K128),
        Figure("speedup_vs_flashinfer_32k", "FlashInfer (CuTe DSL) / ours, 32K", length=K32),
        Figure("speedup_vs_fla_128k", "FLA (Triton) / ours, 128K", ">=", 2.0, K128),
        Figure("speedup_vs_fla_4k", "FLA (Triton) / ours, 4K", ">=", 1.5, K4),
        Figure("mem_ratio_vs_fla_128k", "ours' / FLA's peak memory increment, 128K", "<=", 0.4, K128),
    ],
    "model": [
        Figure("prefill_speedup_vs_hf_best_128k_qwen35_4b", "transformers (fastest) / SparseGDN + InfLLM-V2, 128K",
               ">=", 2.0),
        Figure("prefill_speedup_vs_own_dense_128k_qwen35_4b", "ours dense / SparseGDN + InfLLM-V2 prefill, 128K"),
        Figure("decode_speedup_vs_hf_best_b16_32k_qwen35_4b", "InfLLM-V2 / transformers' fastest decode, B = 16, 32K",
               ">=", 2.0),
        Figure("decode_speedup_vs_hf_b16_32k_qwen35_4b", "InfLLM-V2 / transformers' eager `generate`, B = 16, 32K"),
    ],
    "sparse_attn": [
        Figure("select_speedup_prefill_128k", "InfLLM-V2 / Forecast selection, prefill, B = 4, 128K", ">=", 2.5),
        Figure("select_speedup_decode_128k", "InfLLM-V2 / Forecast selection, decode step, B = 4, 128K", ">=", 2.0),
        Figure("prefill_attn_speedup_vs_sdpa_128k", "SDPA (fastest) / selection + block-sparse attention, B = 4, 128K",
               ">=", 5.0),
        Figure("decode_attn_speedup_vs_dense_128k", "SDPA decode / block-sparse decode attention, B = 4, 128K", ">=",
               8.0),
    ],
    "serve": [
        Figure("concurrent_vs_sequential_8", "8 requests at once / one at a time, duration", "<=", 0.5),
        Figure("sequential_ttft_share", "prefill's share of the one-at-a-time run (about the lowest ratio reachable)"),
        Figure("output_throughput", "output tokens/s, 8 at once"),
        Figure("median_ttft_ms", "median time to first token, 8 at once (ms)"),
        Figure("median_tpot_ms", "median time per output token, 8 at once (ms)"),
    ],
}  # fmt: skip
"""Each benchmark's headline keys (``model``'s for Qwen3.5-4B)."""


def load(name: str, results: Path = RESULTS) -> dict | None:
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def fmt(value, digits: int = 2) -> str:
    return "not measured" if value is None else f"{value:.{digits}f}"


def _run_label(data: dict) -> str:
    """The device and source tree of a result; its date stays in the JSON (documents carry no dates)."""
    env = data.get("environment", {})
    return f"{env.get('device', '?')}, tree {env.get('git_commit') or '?'}"


def _row(data: dict, **key) -> dict | None:
    return next((r for r in data.get("rows", []) if all(r.get(k) == v for k, v in key.items())), None)


def _case(row: dict) -> str:
    """``B × T`` of a ``bench gdn`` row, T in K."""
    return f"{row['B']} × {row['T'] // 1024}K"


def headline_table(name: str, data: dict | None) -> str:
    """The block of one benchmark: its run and a table of its summary keys (value, target, status)."""
    if data is None:
        return f"No `results/{name}.json` yet."
    summary = data.get("summary", {})
    lines = [f"Figures of `results/{name}.json` ({_run_label(data)}):", "",
             "| key | meaning | value | target | status |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for fig in TABLES[name]:
        value = summary.get(fig.key)
        row = _row(data, B=1, T=fig.length) if fig.length else None
        checked = row is None or row.get("passed") is True  # bench gdn's rows: no "passed" when not checked
        lines.append(f"| `{fig.key}` | {fig.meaning} | {fmt(value)} | {fig.target} | {fig.status(value, checked)} |")
    notes = [f"`{k}`: {v}" for k, v in summary.items() if k.endswith("_unavailable") and v]
    if name == "gdn_core":
        rows = [r for r in data.get("rows", []) if "ours_ms" in r]
        checked = [_case(r) for r in rows if r.get("passed") is True]
        unchecked = [_case(r) for r in rows if "passed" not in r]
        failed = [_case(r) for r in rows if r.get("passed") is False]
        notes.append(f"rows checked against the specification: {', '.join(checked) or 'none'}")
        notes += [f"not checked: {', '.join(unchecked)}"] if unchecked else []
        notes += [f"FAILED their check: {', '.join(failed)}"] if failed else []
        if summary.get("best_dense_128k"):
            notes.append(f"fastest dense kernel at 128K: {summary['best_dense_128k']}")
    if name == "model":
        best = summary.get("decode_hf_best_b16_32k_qwen35_4b")
        if best:
            notes.append(f"transformers' fastest decode at batch 16, 32K: `{best}`")
        hf = summary.get("prefill_hf_best_128k_qwen35_4b")
        if hf:
            notes.append(f"transformers' prefill at 128K: GDN kernel {hf.get('gdn_kernel')}, short convolution "
                         f"{hf.get('conv_kernel')}" + (f" ({hf['note']})" if hf.get("note") else ""))  # fmt: skip
    if notes:
        lines += ["", textwrap.fill("; ".join(notes) + ".", WIDTH, break_on_hyphens=False)]
    return "\n".join(lines)


def _gdn_sentence(data: dict) -> str:
    s = data.get("summary", {})
    row = _row(data, B=1, T=131072) or {}
    checked = "checked against the specification at 128K" if row.get("passed") is True else "not checked at 128K"
    peers = [f"{fmt(s.get('speedup_vs_fla_128k'))}× FLA", f"{fmt(s.get('speedup_vs_flashqla_128k'))}× FlashQLA"]
    if s.get("speedup_vs_flashinfer_128k") is not None:
        peers.append(f"{fmt(s['speedup_vs_flashinfer_128k'])}× FlashInfer")
    elif s.get("flashinfer_unavailable"):
        peers.append("FlashInfer not measured")
    best = ""
    if s.get("speedup_vs_best_dense_128k") is not None:
        best = (f"; {fmt(s['speedup_vs_best_dense_128k'])}× the fastest dense kernel ({s.get('best_dense_128k')}), "
                "goal 1.3×")  # fmt: skip
    return (f"SparseGDN's prefill kernels, one GDN layer at 128K (`gdn_core`, {_run_label(data)}): "
            f"{', '.join(peers)}{best}, at {fmt(s.get('mem_ratio_vs_fla_128k'))} of FLA's memory "
            f"({checked}).")  # fmt: skip


def _model_sentence(data: dict) -> str:
    s = data.get("summary", {})
    dense = (s.get("prefill", {}).get("qwen3.5-4b", {}).get("128K", {}).get("dense", {}) or {}).get("speedup_vs_hf")
    hf = _row(data, geometry="qwen3.5-4b", phase="prefill", mode="hf", T=131072) or {}
    conv = {"causal_conv1d": "causal-conv1d", "torch fallback": "torch"}.get(hf.get("hf_conv_kernel"), "?")
    eager = f"{fmt(s.get('decode_speedup_vs_hf_b16_32k_qwen35_4b'))}× its eager `generate`"
    if s.get("decode_speedup_vs_hf_best_b16_32k_qwen35_4b") is not None:
        decode = (f"{fmt(s['decode_speedup_vs_hf_best_b16_32k_qwen35_4b'])}× transformers' fastest decode "
                  f"(`{s.get('decode_hf_best_b16_32k_qwen35_4b')}`), {eager}")  # fmt: skip
    else:
        decode = f"{eager} (its compiled static-cache decode not measured yet)"
    return (
        f"Whole Qwen3.5-4B model, random weights (`model`, {_run_label(data)}): prefill at 128K "
        f"{fmt(dense)}× transformers (FLA kernels, {conv} short convolution) with ours dense, "
        f"{fmt(s.get('prefill_speedup_vs_hf_128k_qwen35_4b'))}× with SparseGDN + InfLLM-V2 (target 2×); decode "
        f"at batch 16, 32K (CUDA graphs, InfLLM-V2) {decode}; target 2× transformers' fastest."
    )


def _attn_sentence(data: dict) -> str:
    s = data.get("summary", {})
    return (
        f"SparDA attention, one layer at MiniCPM4.1-8B shapes, 128K, batch 4 (`sparse_attn`, {_run_label(data)}): "
        f"Forecast selection {fmt(s.get('select_speedup_prefill_128k'))}× InfLLM-V2's in prefill and "
        f"{fmt(s.get('select_speedup_decode_128k'))}× in decode; selection + block-sparse attention "
        f"{fmt(s.get('prefill_attn_speedup_vs_sdpa_128k'))}× torch SDPA's fastest dense backend; block-sparse "
        f"decode attention {fmt(s.get('decode_attn_speedup_vs_dense_128k'))}× dense decode."
    )


def where_it_stands(results: Path = RESULTS) -> str:
    """README's summary: one line per benchmark, each from its results file."""
    head = (
        "**Where it stands** (H200, random weights at real shapes; every ratio against the peer measured side by "
        "side in the same run; rendered from `benchmarks/results/*.json` by `python -m longsparse.bench.figures`):"
    )
    lines = [textwrap.fill(head, WIDTH), ""]
    for name, sentence in (("model", _model_sentence), ("gdn_core", _gdn_sentence), ("sparse_attn", _attn_sentence)):
        data = load(name, results)
        text = sentence(data) if data is not None else f"`{name}`: no results yet."
        lines.append(textwrap.fill(text, WIDTH, initial_indent="* ", subsequent_indent="  ", break_on_hyphens=False))
    return "\n".join(lines)


def render(block: str, results: Path = RESULTS) -> str:
    return where_it_stands(results) if block == "where-it-stands" else headline_table(block, load(block, results))


def _markers(block: str) -> tuple[str, str]:
    return f"<!-- figures:{block}:begin -->", f"<!-- figures:{block}:end -->"


def replace_block(text: str, block: str, body: str) -> str:
    """``text`` with the lines between ``block``'s markers replaced by ``body``; ValueError if the markers are not
    there exactly once each, in order."""
    begin, end = _markers(block)
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if text.count(begin) != 1 or text.count(end) != 1 or not pattern.search(text):
        raise ValueError(f"figures block {block!r}: expected one {begin} line followed by one {end} line")
    return pattern.sub(lambda _: f"{begin}\n{body}\n{end}", text)


def sync(root: Path = ROOT, results: Path = RESULTS, check: bool = False) -> list[str]:
    """Rewrite every block of :data:`DOCUMENTS` under ``root`` from ``results``; with ``check``, write nothing and
    return the ``document:block`` names whose text differs from the rendering (empty: all agree)."""
    stale = []
    for doc, blocks in DOCUMENTS.items():
        path = root / doc
        text = path.read_text()
        new = text
        for block in blocks:
            rendered = replace_block(new, block, render(block, results))
            if rendered != new:
                stale.append(f"{doc}:{block}")
            new = rendered
        if not check and new != text:
            path.write_text(new)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m longsparse.bench.figures", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a block disagrees with the JSON")
    args = parser.parse_args(argv)
    stale = sync(check=args.check)
    if args.check and stale:
        print("out of date with benchmarks/results (run python -m longsparse.bench.figures): " + ", ".join(stale))
        return 1
    print(("rewrote " + ", ".join(stale)) if stale else "every figures block agrees with benchmarks/results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
