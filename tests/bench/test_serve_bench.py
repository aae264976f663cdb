"""`longsparse bench serve` against `longsparse serve` started by it on a tiny checkpoint: every request completes
with its output length, the timings are consistent, and the concurrent run is compared with the sequential one."""

import json

import pytest

from longsparse import cli
from longsparse.bench.serve import RequestResult, summarize
from tests.tiny_models import EOS, build, save, write_tokenizer

pytestmark = pytest.mark.slow


def test_summary_of_request_timings():
    results = [
        RequestResult(10, output_tokens=5, ttft=0.1, latency=0.5, itl=[0.1] * 4),
        RequestResult(12, output_tokens=3, ttft=0.3, latency=0.5, itl=[0.1, 0.1]),
        RequestResult(9, error="HTTP 503: full"),
    ]
    row = summarize(results, duration=2.0)
    assert (row["completed"], row["failed"], row["total_output_tokens"], row["total_input_tokens"]) == (2, 1, 8, 22)
    assert row["output_throughput"] == 4.0 and row["request_throughput"] == 1.0
    assert row["mean_ttft_ms"] == pytest.approx(200) and row["median_ttft_ms"] == pytest.approx(100)
    assert row["mean_tpot_ms"] == pytest.approx(100) and row["p99_e2el_ms"] == pytest.approx(500)
    assert row["errors"] == ["HTTP 503: full"]


def test_bench_serve_starts_a_server_and_compares_concurrent_with_sequential(tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    hf = build("llama-gqa-bias", seed=9, eos_token_id=EOS, bos_token_id=None)
    model = save(hf, tmp_path / "tiny")
    write_tokenizer(model)
    argv = ["bench", "--out", str(tmp_path), "serve", "--model", str(model), "--num-prompts", "3", "--prompt-len",
            "20", "--output-len", "6", "--token-range", "0", "100", "--compare-sequential", "--max-model-len", "64",
            "--max-num-seqs", "3", "--threads", "1"]  # fmt: skip
    assert cli.main(argv) == 0
    data = json.loads((tmp_path / "results" / "serve.json").read_text())
    rows = {r["run"]: r for r in data["rows"]}
    assert set(rows) == {"sequential", "concurrent"}
    assert rows["sequential"]["max_concurrency"] == 1 and rows["concurrent"]["max_concurrency"] == 3
    for row in rows.values():
        assert row["completed"] == 3 and row["failed"] == 0 and row["total_output_tokens"] == 18
        assert 0 < row["median_ttft_ms"] <= row["median_e2el_ms"] and row["median_tpot_ms"] > 0
        assert len(row["load_average_before"]) == 3
    ratio = rows["concurrent"]["duration_s"] / rows["sequential"]["duration_s"]
    assert data["summary"]["concurrent_vs_sequential_3"] == pytest.approx(ratio)
    share = rows["sequential"]["mean_ttft_ms"] * 3 / 1000 / rows["sequential"]["duration_s"]
    assert data["summary"]["sequential_ttft_share"] == pytest.approx(share) and 0 < share < 1
    assert "--max-num-seqs 3" in data["environment"]["server_command"]
