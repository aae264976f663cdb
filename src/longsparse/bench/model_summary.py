"""The summary, plots and tables of `longsparse bench model`, computed from its rows alone (so that merged runs and
``--report`` give the same figures as a single run)."""

from __future__ import annotations

from pathlib import Path

from ..reports.tables import format_table
from .components import COMPONENTS
from .model_cases import DECODE_MODES, FULL_MODE, HF_MODES, MEANINGFUL_MODES, MODES, tokens_label


def _pick(rows, label, phase, mode, T, B=1) -> dict | None:
    for r in rows:
        if (r.get("geometry"), r.get("phase"), r.get("mode"), r.get("T"), r.get("B")) == (label, phase, mode, T, B):
            return r
    return None


def _ok(row: dict | None) -> bool:
    return row is not None and "error" not in row and "skipped" not in row and row.get("checks_pass") is not False


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def summarise(rows: list[dict]) -> dict:
    """Headline figures (for Qwen3.5-4B) and, per geometry and length, every mode's speedup.

    A speedup is reported only if both rows ran, ours-dense agreed with transformers in that phase at that length
    (its ``checks_pass``: prefill logits, or the first decode step's), no float32 check of the model failed, and the
    mode's own checks passed; ``None`` otherwise. ``speedup_vs_hf`` is against transformers' eager ``generate``
    (decode) or its one prefill configuration; ``speedup_vs_hf_best`` against the fastest of transformers'
    configurations measured at that case (:data:`HF_MODES`), named in ``hf_best``."""
    summary: dict = {"prefill": {}, "decode": {}}
    labels = sorted({r.get("geometry") for r in rows if r.get("geometry")})
    for label in labels:
        # a failed float32 check (ours-dense less accurate than transformers) voids every speedup of the model
        accurate = not any(r.get("geometry") == label and r.get("phase") == "fp32_check"
                           and r.get("checks_pass") is False for r in rows)  # fmt: skip
        per = summary["prefill"].setdefault(label, {})
        for T in sorted({r["T"] for r in rows if r.get("geometry") == label and r.get("phase") == "prefill"}):
            dense = _pick(rows, label, "prefill", "dense", T)
            hf = _pick(rows, label, "prefill", "hf", T)
            trusted = accurate and _ok(dense) and dense.get("checks_pass") is True
            entry = per.setdefault(tokens_label(T), {})
            for mode in MODES:
                r = _pick(rows, label, "prefill", mode, T)
                if not _ok(r) or "ms" not in r:
                    continue
                e = entry[mode] = {"ms": r["ms"], "peak_gib": r.get("peak_gib")}
                if "check_rel_vs_dense" in r:
                    e["rel_vs_dense"] = r["check_rel_vs_dense"]
                if trusted and mode != "hf":
                    e["speedup_vs_hf"] = _ratio(hf.get("ms"), r["ms"]) if _ok(hf) else None
                    e["speedup_vs_dense"] = _ratio(dense["ms"], r["ms"])
            usable = {m: e["ms"] for m, e in entry.items() if m in MEANINGFUL_MODES}
            if usable:
                entry["fastest_meaningful"] = min(usable, key=usable.get)
        dec = summary["decode"].setdefault(label, {})
        for r in rows:
            if r.get("geometry") == label and r.get("phase") == "decode" and _ok(r) and "tokens_per_s" in r:
                hf = _pick(rows, label, "decode", "hf", r["T"], r["B"])
                fastest = _fastest_hf(rows, label, r["T"], r["B"])
                dense_rows = [d for d in rows if (d.get("geometry"), d.get("phase"), d.get("mode"), d.get("T"))
                              == (label, "decode", "dense", r["T"])]  # fmt: skip
                trusted = accurate and any(d.get("checks_pass") is True for d in dense_rows)
                key = f"{tokens_label(r['T'])}_b{r['B']}"
                entry = dec.setdefault(key, {})
                entry[r["mode"]] = {
                    "tokens_per_s": r["tokens_per_s"],
                    "speedup_vs_hf": (
                        _ratio(r["tokens_per_s"], hf.get("tokens_per_s")) if _ok(hf) and trusted else None
                    ),
                    "speedup_vs_hf_best": (
                        _ratio(r["tokens_per_s"], fastest["tokens_per_s"]) if fastest and trusted else None
                    ),
                }
                if fastest:
                    entry["hf_best"] = fastest["mode"]
    summary["fp32_check"] = {
        r["geometry"]: {
            k: r.get(k) for k in ("T", "check_rel_vs_fp32", "hf_rel_vs_fp32", "check_rel_vs_hf", "checks_pass")
        }
        for r in rows
        if r.get("phase") == "fp32_check" and "check_rel_vs_fp32" in r
    }
    four = summary["prefill"].get("qwen3.5-4b", {}).get("128K", {})
    full = four.get(FULL_MODE, {})
    summary["prefill_speedup_vs_hf_128k_qwen35_4b"] = full.get("speedup_vs_hf")
    # transformers has one prefill configuration: the fastest it has here (FLA, and causal-conv1d when installed)
    summary["prefill_speedup_vs_hf_best_128k_qwen35_4b"] = full.get("speedup_vs_hf")
    hf_128k = _pick(rows, "qwen3.5-4b", "prefill", "hf", 131072)
    if hf_128k is not None:
        summary["prefill_hf_best_128k_qwen35_4b"] = {
            "gdn_kernel": hf_128k.get("hf_gdn_kernel"),
            "conv_kernel": hf_128k.get("hf_conv_kernel"),
            "note": hf_128k.get("hf_conv_note"),
        }
    summary["prefill_speedup_vs_own_dense_128k_qwen35_4b"] = full.get("speedup_vs_dense")
    summary["prefill_speedup_vs_hf_128k_qwen35_4b_sparda"] = four.get("sparda", {}).get("speedup_vs_hf")
    dense = _pick(rows, "qwen3.5-4b", "prefill", "dense", 131072)
    share = dense.get("breakdown_share") if _ok(dense) else None
    summary["gdn_share_of_prefill_128k_dense"] = share.get("gdn_core") if share else None
    summary["attn_share_of_prefill_128k_dense"] = share.get("attention") if share else None
    hf_row = _pick(rows, "qwen3.5-4b", "prefill", "hf", 131072)
    hf_share = hf_row.get("breakdown_share") if _ok(hf_row) else None
    summary["gdn_share_of_prefill_128k_hf"] = hf_share.get("gdn_core") if hf_share else None
    summary["attn_share_of_prefill_128k_hf"] = hf_share.get("attention") if hf_share else None
    b16 = summary["decode"].get("qwen3.5-4b", {}).get("32K_b16", {})
    summary["decode_speedup_vs_hf_b16_32k_qwen35_4b"] = b16.get(FULL_MODE, {}).get("speedup_vs_hf")
    summary["decode_speedup_vs_hf_best_b16_32k_qwen35_4b"] = b16.get(FULL_MODE, {}).get("speedup_vs_hf_best")
    summary["decode_hf_best_b16_32k_qwen35_4b"] = b16.get("hf_best")
    summary["full_mode"] = FULL_MODE
    summary["targets"] = {
        "prefill_speedup_vs_hf_128k_qwen35_4b": 2.0,
        "prefill_speedup_vs_hf_best_128k_qwen35_4b": 2.0,
        "decode_speedup_vs_hf_b16_32k_qwen35_4b": 2.0,
        "decode_speedup_vs_hf_best_b16_32k_qwen35_4b": 2.0,
    }
    return summary


def _fastest_hf(rows: list[dict], label: str, T: int, B: int) -> dict | None:
    """The fastest of transformers' decode configurations (:data:`HF_MODES`) whose row at (``T``, ``B``) ran and
    passed its checks, or None."""
    done = [r for m in HF_MODES if _ok(r := _pick(rows, label, "decode", m, T, B)) and r.get("tokens_per_s")]
    return max(done, key=lambda r: r["tokens_per_s"]) if done else None


def plots(rows: list[dict], out: Path, name: str = "model") -> list[Path]:
    """Per geometry: the component split of every prefill (stacked bars per length and mode) and decode tokens/s
    against the batch size (one panel per context), as ``<out>/plots/<name>_<geometry>.png`` and
    ``<name>_decode_<geometry>.png``."""
    from ..reports.plot import panel_plot, stacked_bars

    paths = []
    for label in sorted({r.get("geometry") for r in rows if r.get("geometry")}):
        slug = label.replace(".", "").replace("-", "_").replace(":", "_").replace("/", "_")
        pre = sorted((r for r in rows if r.get("geometry") == label and r.get("phase") == "prefill"
                      and "breakdown_ms" in r), key=lambda r: (r["T"], list(MODES).index(r["mode"])))  # fmt: skip
        if pre:
            groups = [f"{tokens_label(r['T'])} {r['mode']}" for r in pre]
            parts = {c: [r["breakdown_ms"][c] / 1e3 for r in pre] for c in COMPONENTS}
            paths.append(stacked_bars(out / "plots" / f"{name}_{slug}.png", groups, parts,
                                      title=f"Prefill time by component, {label}, B=1 (s)", ylabel="s"))  # fmt: skip
        dec = [r for r in rows if r.get("geometry") == label and r.get("phase") == "decode" and "tokens_per_s" in r]
        if dec:
            batches = sorted({r["B"] for r in dec})
            panels = {}
            for T in sorted({r["T"] for r in dec}):
                panels[f"context {tokens_label(T)}"] = {
                    mode: [(_pick(dec, label, "decode", mode, T, B) or {}).get("tokens_per_s") for B in batches]
                    for mode in DECODE_MODES
                }
            paths.append(panel_plot(out / "plots" / f"{name}_decode_{slug}.png", batches, panels,
                                    title=f"Decode throughput, {label} (eager steps)", xlabel="batch",
                                    ylabel="tokens/s"))  # fmt: skip
    return paths


def report(rows: list[dict], summary: dict, paths: list[Path]) -> None:
    """Print the float32 checks, the prefill and decode tables, the headline figures and the written files."""
    checks = [r for r in rows if r.get("phase") == "fp32_check"]
    if checks:
        columns = ["geometry", "T", "check_rel_vs_fp32", "hf_rel_vs_fp32", "check_rel_vs_hf", "check_top1_vs_fp32",
                   "hf_top1_vs_fp32", "checks_pass", "error", "skipped"]  # fmt: skip
        print(format_table(checks, columns))
    print(format_table([r for r in rows if r.get("phase") == "prefill"],
                       ["geometry", "mode", "T", "ms", "peak_gib", "check_rel_vs_dense", "check_rel_vs_hf",
                        "checks_pass", "error", "skipped"]))  # fmt: skip
    print(format_table([r for r in rows if r.get("phase") == "decode"],
                       ["geometry", "mode", "T", "B", "tokens_per_s", "timed", "eager_tokens_per_s", "ms_per_step",
                        "check_step_vs_forward",
                        "check_rel_vs_hf", "check_tol", "check_rel_vs_dense", "checks_pass", "error",
                        "skipped"]))  # fmt: skip
    print({k: v for k, v in summary.items() if k not in ("prefill", "decode", "targets", "fp32_check")})
    print("wrote " + ", ".join(str(p) for p in paths))
