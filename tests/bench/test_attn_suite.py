"""`longsparse bench attn`: registered, parses, and only reports a speed-up whose row passed its checks."""

import json

import pytest

from longsparse.bench import BenchmarkResult
from longsparse.bench.attn import _checks_pass, _heads, _summarise, tile_sizes
from longsparse.cli import build_parser, main


def test_suite_is_registered_and_parses():
    args = build_parser().parse_args(["bench", "--out", "x", "attn", "--seq-lens", "1024", "--batches", "2"])
    assert args.suite == "attn" and args.seq_lens == "1024" and args.batches == "2" and args.out == "x"


def test_checks_gate_the_summary():
    res = BenchmarkResult("unit", environment={})
    good = {"check_a_rel": 1e-3, "check_b_ok": True}
    rows = [
        dict(phase="prefill", B=4, T=131072, select_speedup=3.0, prefill_speedup_vs_sdpa=6.0, **good),
        dict(phase="decode", B=4, T=131072, decode_select_speedup=2.5, decode_attn_speedup=9.0, check_x_ok=False),
        dict(phase="prefill", B=1, T=131072, select_speedup=2.0, prefill_speedup_vs_sdpa=float("nan"), **good),
        dict(phase="decode", B=1, T=131072, error="OOM"),
    ]
    for r in rows:
        stored = res.add(**r)
        stored["checks_pass"] = "error" not in r and _checks_pass(stored)
    assert [r["checks_pass"] for r in res.rows] == [True, False, True, False]
    _summarise(res, 131072)
    s = res.summary
    assert s["select_speedup_prefill_128k"] == 3.0 and s["prefill_attn_speedup_vs_sdpa_128k"] == 6.0
    assert s["select_speedup_decode_128k"] is None and s["decode_attn_speedup_vs_dense_128k"] is None
    assert s["select_speedup_prefill_128k_b1"] == 2.0 and s["decode_attn_speedup_vs_dense_128k_b1"] is None
    assert not _checks_pass({"check_rel": float("nan")}) and not _checks_pass({"check_rel": 0.5})


def test_tile_sizes_are_those_the_kernel_accepts():
    """At least 16 (token, head) rows, powers of two up to 16 dividing the block: MiniCPM4's G = 16 runs 1-16
    tokens per tile, Qwen3.5's G = 4 runs 4-16, a group of 3 (padded to 4 rows) the same."""
    assert tile_sizes(16, 64) == [1, 2, 4, 8, 16]
    assert tile_sizes(4, 64) == tile_sizes(3, 64) == [4, 8, 16]
    assert tile_sizes(1, 16) == [16] and tile_sizes(4, 8) == [4, 8]


def test_heads_option_parses_and_refuses_bad_shapes():
    assert _heads("16,4,256") == (16, 4, 256)
    for bad in ("16,4", "16,5,128", "a,b,c", "0,1,1"):
        with pytest.raises(SystemExit, match="--heads"):
            _heads(bad)


def test_tiny_cpu_run_records_both_decode_protocols(tmp_path, monkeypatch):
    """Decode ops are timed over layers and alone; the summary has both ratios, each from a checked row (the torch
    references run here: the interpreter is off, the kernels have their own tests)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert main(["bench", "--out", str(tmp_path), "attn", "--tiny"]) == 0
    res = json.loads((tmp_path / "results" / "sparse_attn.json").read_text())
    (dec,) = [r for r in res["rows"] if r["phase"] == "decode"]
    assert dec["checks_pass"] and dec["decode_layers"] == 1  # one layer off the GPU
    for op in ("infllmv2_select", "forecast_select", "compress_step", "sparse_decode", "dense_decode"):
        assert dec[f"{op}_us"] > 0 and dec[f"{op}_single_us"] > 0 and dec[f"{op}_eager_us"] > 0
    s = res["summary"]
    assert s["decode_attn_speedup_vs_dense_192"] == dec["decode_attn_speedup"]
    assert s["decode_attn_speedup_vs_dense_192_single_call"] == dec["decode_attn_speedup_single"]


def test_decode_layers_must_be_positive(tmp_path):
    with pytest.raises(SystemExit, match="--decode-layers"):
        main(["bench", "--out", str(tmp_path), "attn", "--tiny", "--decode-layers", "0"])
