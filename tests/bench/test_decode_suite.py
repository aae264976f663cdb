"""`longsparse bench decode`: registered, parses, its summary is gated by the in-run checks, the projection fits the
measured step times, and a tiny CPU run writes every summary key and the plot."""

import json

import pytest
import torch

from longsparse.bench import BenchmarkResult
from longsparse.bench.decode import _fit, _summarise
from longsparse.cli import build_parser, main
from tests.helpers import one_thread

KEYS = (
    "sparda_vs_sparse_offload_b8_128k",
    "sparda_vs_sparda_noprefetch_b16_128k",
    "uva_copy_vs_bulk_h2d",
    "hit_rate_128k",
    "gpu_bytes_per_seq_128k_sparda",
    "gpu_bytes_per_seq_128k_sparse_gpu",
    "projected_peak_ratio_2tb_128k",
)


def test_suite_is_registered_and_parses():
    args = build_parser().parse_args(["bench", "--out", "x", "decode", "--contexts", "4096", "--batches", "2,4"])
    assert args.suite == "decode" and args.contexts == "4096" and args.batches == "2,4" and args.steps == 8


def _row(mode, batch, tok, **extra):
    return dict(kind="decode", context=131072, mode=mode, batch=batch, status="ok", tokens_per_s=tok,
                cache_gpu_bytes_per_seq=1e6 * batch, **extra)  # fmt: skip


@pytest.mark.parametrize("checks_ok", [True, False], ids=["checks-pass", "checks-fail"])
def test_summary_ratios_need_the_checks(checks_ok):
    res = BenchmarkResult("unit", environment={})
    for r in (
        _row("sparda", 8, 300.0, hit_rate=0.5),
        _row("sparse_offload", 8, 150.0, hit_rate=0.4),
        _row("sparda", 16, 500.0, hit_rate=0.7),
        _row("sparda_noprefetch", 16, 400.0, hit_rate=0.7),
        _row("sparse_gpu", 4, 200.0),
        dict(kind="decode", context=131072, mode="sparse_gpu", batch=32, status="OOM (GPU)"),
        dict(kind="copy", path="bulk pinned H2D (one copy)", gbps=50.0, bit_exact=True),
        dict(kind="copy", path="UVA gather kernel, 16 CTAs", gbps=47.0, bit_exact=True),
        dict(kind="copy", path="UVA gather kernel, 64 CTAs", gbps=60.0, bit_exact=False),
    ):
        res.add(**r)
    proj = {("sparda", 131072, "2TB"): dict(projected_tokens_per_s=1000.0)}
    _summarise(res, proj, checks_ok, 131072)
    s = res.summary
    assert set(KEYS) <= set(s)
    assert s["uva_copy_vs_bulk_h2d"] == pytest.approx(47 / 50)  # the copy that was not bit-exact does not count
    assert s["hit_rate_128k"] == pytest.approx(0.6)
    assert s["gpu_bytes_per_seq_128k_sparda"] == 8e6
    assert s["largest_batch_measured"]["sparse_gpu_128k"] == 4
    if checks_ok:
        assert s["sparda_vs_sparse_offload_b8_128k"] == 2.0 and s["sparda_vs_sparda_noprefetch_b16_128k"] == 1.25
        assert s["projected_peak_ratio_2tb_128k"] == 5.0
    else:
        assert s["sparda_vs_sparse_offload_b8_128k"] is None and s["projected_peak_ratio_2tb_128k"] is None


def test_step_time_fit_is_linear_in_the_batch():
    a, b = _fit([(4, 14.0), (8, 18.0), (16, 26.0)])
    assert a == pytest.approx(10.0) and b == pytest.approx(1.0)
    assert _fit([(8, 16.0)]) == (0.0, 2.0)


@pytest.mark.slow
def test_tiny_cpu_run_writes_every_key(tmp_path):
    with one_thread():
        assert main(["bench", "--out", str(tmp_path), "decode", "--tiny", "--steps", "2", "--warmup", "1"]) == 0
    data = json.loads((tmp_path / "results" / "decode.json").read_text())
    assert set(KEYS) <= set(data["summary"]) and data["summary"]["checks_pass"] is True
    kinds = {r["kind"] for r in data["rows"]}
    assert {"decode", "copy", "checks", "projection"} <= kinds
    assert all(r["status"] == "ok" for r in data["rows"] if r["kind"] == "decode")
    assert (tmp_path / "plots" / "decode.png").is_file()


@pytest.mark.parametrize("mode", ["dense_gpu", "sparse_gpu", "sparse_offload", "sparda"])
def test_graph_stepper_logic_equals_eager_decode(mode):
    """The CUDA-graph stepper's step function (static buffers advanced in place, bookkeeping and write-backs after
    the step), run without a graph, decodes what the eager stepper decodes — across block fills."""
    from longsparse.bench.decode import TINY_MODEL, TINY_SPARSE, _fill, random_model
    from longsparse.engine import allocate_compressed_keys
    from longsparse.engine.decode_graph import EagerStepper, GraphStepper
    from longsparse.engine.decode_modes import build_cache, prepare_model
    from longsparse.models.forecast import ForecastProjections

    with one_thread():
        model = random_model(TINY_MODEL, 400, torch.device("cpu"), torch.float32, seed=2)
        prepare_model(model, mode, TINY_SPARSE, forecast=ForecastProjections.random(model.config, seed=3))
        out = {}
        for kind in (EagerStepper, GraphStepper):
            cache = build_cache(model.config, mode, 2, 300, torch.float32, "cpu", TINY_SPARSE, check_memory=False)
            compressed = allocate_compressed_keys(model, 2, 300)
            _fill(cache, compressed, model.config, TINY_SPARSE, 2, 250, torch.device("cpu"), torch.float32, seed=4)
            args = (model, cache, compressed, torch.tensor([1, 2]), [250, 250], 300, mode == "dense_gpu")
            stepper = GraphStepper(*args, capture=False) if kind is GraphStepper else EagerStepper(*args)
            with torch.inference_mode():
                logits = torch.stack([stepper.step().clone() for _ in range(20)])  # crosses the block at 256
            out[kind] = (logits, cache, compressed)
    (want, eager_cache, eager_cmp), (got, graph_cache, graph_cmp) = out[EagerStepper], out[GraphStepper]
    assert torch.equal(got, want)
    for layer in model.config.attention_layers:
        assert torch.equal(graph_cache.gather(layer, [0, 1], 270)[0], eager_cache.gather(layer, [0, 1], 270)[0])
    if mode != "dense_gpu":
        for layer in model.config.attention_layers:  # the compressed keys advanced in place inside the step
            assert torch.equal(graph_cmp.k_cmp[layer], eager_cmp.k_cmp[layer])
            assert (graph_cmp.k_cmp[layer][:, : TINY_SPARSE.num_compressed(269)] != 0).any()
    if mode in ("sparse_offload", "sparda"):
        assert graph_cache.lengths == eager_cache.lengths == [270, 270]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_copy_microbench_on_the_gpu_checks_every_path_bit_for_bit():
    """Pinned host rows against GPU rows: every path (bulk, UVA gather per quota, UVA write, CPU gather) is timed and
    compared bit for bit across the two devices."""
    from longsparse.bench.decode import copy_microbench

    host = torch.empty(64 * 16384, dtype=torch.uint8).pin_memory()
    rows = copy_microbench(host, torch.device("cuda"), [8, 16], seed=0, rows=32, use_kernel=None)
    assert len(rows) == 5 and all(r["bit_exact"] and r["gbps"] > 0 for r in rows)
