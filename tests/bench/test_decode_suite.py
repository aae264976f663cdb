"""`longsparse bench decode`: registered, parses, its summary is gated by the in-run checks, the projection fits the
measured step times, the locality model is built from its measured terms, replayed selections reach the cache, and
a tiny CPU run writes every summary key and the plots."""

import json

import numpy as np
import pytest
import torch

from longsparse.bench import BenchmarkResult
from longsparse.bench.decode import _fit, _summarise, _summarise_locality, locality_model
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
LOCALITY_KEYS = (
    "hit_rate_replayed_128k",
    "sparda_vs_sparse_offload_b8_128k_locality",
    "sparda_peak_vs_sparse_gpu_peak_128k_measured",
    "projected_peak_ratio_2tb_128k_locality",
    "projected_peak_ratio_2tb_128k_h100_budget",
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


def _locality_file(path) -> str:
    """A `bench locality` result holding a fitted process for each traced selector."""
    res = BenchmarkResult("locality", environment={})
    hazard = np.concatenate([np.linspace(0.5, 0.1, 8), np.full(24, 0.03)])
    for selector in ("sparda_trained", "sparse_infllmv2"):
        res.add(kind="process", selector=selector, hazard=np.tile(hazard, (4, 1)).tolist())
    return str(res.save(path))


def _setting():
    from longsparse.bench.decode import MINICPM41_8B
    from longsparse.models.config import decoder_config_from_hf
    from longsparse.ops.sparse_attn import MINICPM4

    config = decoder_config_from_hf({**MINICPM41_8B, "max_position_embeddings": 131073}, "MiniCPMForCausalLM")
    return dict(config=config, dtype=torch.bfloat16, sparse=MINICPM4, gpu_budget=120 * 2**30,
                paper_gpu_budget=60 * 2**30)  # fmt: skip


@pytest.mark.parametrize("checks_ok", [True, False], ids=["checks-pass", "checks-fail"])
def test_locality_model_is_built_from_its_measured_terms(checks_ok):
    """Compute fitted on SparDA† (a + b·B), copy bytes from the replayed cases, copy rate from the microbenchmark:
    SparDA's model is max(compute, copy), the projection continues it beyond the measured batches up to the capacity
    of each GPU setting, and each ratio is against Sparse†'s measured peak within that setting's memory."""
    res = BenchmarkResult("unit", environment={})
    beta, rate = 40e6, 50.0  # bytes per sequence and step; GB/s
    for batch in (4, 8, 16):
        res.add(**_row("sparda_gpu", batch, 0, ms_per_step=9.0 + 0.25 * batch, selections="model"))
        res.add(**_row("sparse_gpu", batch, batch * 1e3 / (9.0 + 0.3 * batch), ms_per_step=9.0 + 0.3 * batch,
                       selections="model"))  # fmt: skip
        copy = beta * batch / (rate * 1e6)
        for mode, ms in (("sparda", 1.1 * max(9.0 + 0.25 * batch, copy)),
                         ("sparse_offload", 9.0 + 0.3 * batch + copy)):  # fmt: skip
            res.add(**_row(mode, batch, batch * 1e3 / ms, ms_per_step=ms, bytes_per_step=beta * batch,
                           hit_rate=0.75, selections="locality"))  # fmt: skip
    res.add(**_row("sparse_gpu", 13, 13e3 / 12.9, ms_per_step=12.9, selections="model"))
    res.add(**_row("sparda", 8, 50.0, ms_per_step=160.0, bytes_per_step=1e9, selections="random"))  # ignored here
    res.add(kind="copy", path="UVA gather kernel, 16 CTAs", gbps=rate, bit_exact=True)
    model = locality_model(res, _setting(), 131072)
    row = model[("sparda", "h100_budget_2tb")]
    assert row["copy_bytes_per_seq_step"] == pytest.approx(beta) and row["compute_ms_fit"] == pytest.approx((9, 0.25))
    assert row["anchor"] == pytest.approx(1.1) and row["link_ceiling_tokens_per_s"] == pytest.approx(rate * 1e9 / beta)
    assert row["peak_projected"] and row["largest_batch"] > 16
    # copy-bound beyond B = 9 / (0.8 - 0.25): the projection reaches the link's ceiling (scaled by the anchor)
    assert row["peak_tokens_per_s"] == pytest.approx(row["link_ceiling_tokens_per_s"] / 1.1)
    for B, tok in row["curve"].items():
        assert tok == pytest.approx(B * 1e3 / (1.1 * max(9 + 0.25 * B, beta * B / (rate * 1e6))))
    sparse_rows = [r for r in res.rows if r.get("mode") == "sparse_gpu"]
    assert row["sparse_gpu_peak_tokens_per_s"] == max(r["tokens_per_s"] for r in sparse_rows if r["batch"] <= 13)
    _summarise_locality(res, model, checks_ok, 131072)
    s = res.summary
    assert set(LOCALITY_KEYS) <= set(s)
    assert s["hit_rate_replayed_128k"] == pytest.approx(0.75)
    if checks_ok:
        assert s["projected_peak_ratio_2tb_128k_h100_budget"] == pytest.approx(
            row["peak_tokens_per_s"] / row["sparse_gpu_peak_tokens_per_s"]
        )
        assert s["sparda_vs_sparse_offload_b8_128k_locality"] == pytest.approx((9 + 2.4 + 6.4) / (1.1 * 11))
        assert s["sparda_vs_sparse_offload_128k_locality_by_batch"][8] == s["sparda_vs_sparse_offload_b8_128k_locality"]
        b4 = 4e3 / (9 + 0.3 * 4)  # Sparse† at batch 4, the paper's denominator
        assert s["projected_peak_ratio_2tb_128k_h100_budget_vs_sparse_gpu_b4"] == pytest.approx(
            row["peak_tokens_per_s"] / b4
        )
    else:
        assert s["projected_peak_ratio_2tb_128k_h100_budget"] is None
        assert s["sparda_vs_sparse_offload_b8_128k_locality"] is None


def test_replayed_selections_reach_the_cache():
    """A replaying cache hands the bank's lists to the attention (its selection log records them), at every step's
    own position, and refuses a position beyond the bank."""
    from longsparse.bench.decode import TINY_MODEL, TINY_SPARSE, locality_bank, random_model
    from longsparse.bench.locality import LocalityProcess
    from longsparse.bench.replay import replay_selections
    from longsparse.engine import allocate_compressed_keys
    from longsparse.engine.decode_graph import EagerStepper
    from longsparse.engine.decode_modes import build_cache, prepare_model
    from longsparse.models.forecast import ForecastProjections

    with one_thread():
        model = random_model(TINY_MODEL, 400, torch.device("cpu"), torch.float32, seed=2)
        prepare_model(model, "sparda", TINY_SPARSE, forecast=ForecastProjections.random(model.config, seed=3))
        cache = build_cache(model.config, "sparda", 2, 300, torch.float32, "cpu", TINY_SPARSE, check_memory=False)
        compressed = allocate_compressed_keys(model, 2, 300)
        from longsparse.bench.decode import _fill

        _fill(cache, compressed, model.config, TINY_SPARSE, 2, 250, torch.device("cpu"), torch.float32, seed=4)
        process = LocalityProcess(np.full((3, 4), 0.3))
        bank = locality_bank(process, model.config, TINY_SPARSE, 2, 250, 8, torch.device("cpu"), seed=5)
        replay_selections(cache, bank)
        cache.selection_log = []
        stepper = EagerStepper(model, cache, compressed, torch.tensor([1, 2]), [250, 250], 300, dense=False)
        with torch.inference_mode():
            for _ in range(8):
                stepper.step()
    layers = model.config.attention_layers
    assert len(cache.selection_log) == 8 * len(layers)
    for n, (layer, ids) in enumerate(cache.selection_log):
        assert torch.equal(ids, bank.bank[n // len(layers), layers.index(layer)])
    assert cache.transfer_stats()["hits"] > 0
    bank.check([250, 257])
    with pytest.raises(ValueError, match="outside the selection bank"):
        bank.check([258])


@pytest.mark.slow
def test_tiny_cpu_run_writes_every_key(tmp_path):
    locality = _locality_file(tmp_path / "loc")
    with one_thread():
        assert main(["bench", "--out", str(tmp_path), "decode", "--tiny", "--steps", "2", "--warmup", "1",
                     "--batches", "2,4,max", "--locality", locality]) == 0  # fmt: skip
    data = json.loads((tmp_path / "results" / "decode.json").read_text())
    assert set(KEYS + LOCALITY_KEYS) <= set(data["summary"]) and data["summary"]["checks_pass"] is True
    kinds = {r["kind"] for r in data["rows"]}
    assert {"decode", "copy", "checks", "projection", "locality_model"} <= kinds
    assert all(r["status"] == "ok" for r in data["rows"] if r["kind"] == "decode")
    selections = {(r["mode"], r["selections"]) for r in data["rows"] if r["kind"] == "decode"}
    assert {("sparda", "locality"), ("sparda", "random"), ("sparse_gpu", "model")} <= selections
    (checks,) = [r for r in data["rows"] if r["kind"] == "checks"]
    assert checks["check_sparda_locality_logits_max_abs_diff"] == 0.0 and checks["check_sparda_locality_hit_rate"] > 0
    assert (tmp_path / "plots" / "decode.png").is_file() and (tmp_path / "plots" / "decode_locality.png").is_file()


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


def test_sweep_order_time_limit_and_checkpoints(monkeypatch):
    """Per context: the GPU-resident modes and the offloaded ones with the first selections, then the offloaded ones
    with the others; after a failed batch the larger ones are recorded without running; past the time limit the
    remaining cases are recorded as skipped; the results are checkpointed after every case run."""
    import argparse
    import time

    from longsparse.bench import decode

    ran, saved = [], []

    def fake_case(ctx, mode, batch, setting, selections="random"):
        ran.append((mode, batch, selections))
        status = "OOM (host)" if mode == "sparda" and batch == 8 else "ok"
        return dict(kind="decode", context=ctx, mode=mode, batch=batch, status=status, tokens_per_s=1.0,
                    selections="model" if mode in decode.RESIDENT else selections)  # fmt: skip

    monkeypatch.setattr(decode, "run_case", fake_case)
    setting = dict(_setting(), host_budget=64 * 2**30, max_batch_cap=1 << 30, selections=["locality", "random"],
                   args=argparse.Namespace(time_limit=None), t0=time.perf_counter())  # fmt: skip
    res = BenchmarkResult("unit", environment={})
    decode._sweep(res, [131072], ["sparse_gpu", "sparda"], [4, 8, 16], False, setting, lambda: saved.append(1))
    assert [r[2] for r in ran] == ["locality"] * 6 + ["random"] * 2  # sparse_gpu at 4, 8, 14, 16 in the first pass
    assert [r[1] for r in ran if r[0] == "sparse_gpu"] == [4, 8, 14, 16]  # 14: the most within the paper's 60 GiB
    statuses = [(r["selections"], r["batch"], r["status"]) for r in res.rows if r["mode"] == "sparda"]
    assert statuses[:3] == [("locality", 4, "ok"), ("locality", 8, "OOM (host)"), ("locality", 16, "OOM (host)")]
    assert len(saved) == len(ran)
    setting["args"].time_limit = 0.0
    res = BenchmarkResult("unit", environment={})
    decode._sweep(res, [131072], ["sparda"], [4], False, setting, lambda: None)
    assert [r["status"] for r in res.rows] == ["skipped", "skipped"]
