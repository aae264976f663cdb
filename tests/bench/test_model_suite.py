"""`longsparse bench model`: the whole-model suite end to end on a tiny hybrid on the CPU, its component split, its
summary, partial results after failures, and the merge of runs."""

import importlib.util
import json
from types import SimpleNamespace

import pytest
import torch

from longsparse.bench import model as suite
from longsparse.bench.components import COMPONENTS, ComponentClock, breakdown, components, regions_of, shares
from longsparse.bench.geometry import GEOMETRIES, build_pair, hf_gdn_kernel
from longsparse.bench.model_cases import DECODE_MODES, DENSE_TOL, MODES, ROW_KEY, Context, check_logits
from longsparse.bench.model_summary import summarise
from longsparse.cli import build_parser, main
from longsparse.models import ExecutionModes
from longsparse.models.batch import ForwardBatch
from longsparse.models.forecast import ForecastProjections
from longsparse.models.sparse_attention import SpardaAttention
from longsparse.reports.results import RowLog
from tests.helpers import one_thread, rel_err
from tests.tiny_models import import_qwen35

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def pair():
    import_qwen35()  # transformers' Qwen3.5 without FLA, whose kernels fail on the CPU
    return build_pair(GEOMETRIES["tiny-qwen3.5"], CPU, torch.float32, seed=3)


def _run(out, *extra):
    with one_thread():
        return main(["bench", "--out", str(out), "model", "--geometry", "tiny-qwen3.5", "--reps", "1",
                     "--decode-steps", "2", "--decode-warmup", "1", "--device", "cpu", *extra])  # fmt: skip


def _rows(out, name="model"):
    return json.loads((out / "results" / f"{name}.json").read_text())


def test_hf_gdn_kernel_names_what_the_layer_calls():
    def fla_kernel(*args):  # stands for FLA's chunked kernel, as an older transformers stores it on the layer
        return args

    fla_kernel.__module__ = "fla.ops.gated_delta_rule.chunk"

    class FakeGatedDeltaNet(torch.nn.Module):
        chunk_gated_delta_rule = staticmethod(fla_kernel)

    class TorchGatedDeltaNet(torch.nn.Module):
        chunk_gated_delta_rule = staticmethod(lambda *args: args)

    assert hf_gdn_kernel(torch.nn.Sequential(FakeGatedDeltaNet())) == "fla"
    assert hf_gdn_kernel(torch.nn.Sequential(TorchGatedDeltaNet())) == "torch fallback"
    assert hf_gdn_kernel(torch.nn.Sequential(torch.nn.Linear(2, 2))) is None


def test_suite_is_registered_and_parses():
    args = build_parser().parse_args(["bench", "model", "--geometry", "qwen3.5-9b", "--phase", "decode", "--append"])
    assert args.suite == "model" and args.geometry == "qwen3.5-9b" and args.phase == "decode" and args.append


def test_components_from_region_totals():
    raw = {"linear": 10.0, "mlp": 20.0, "attention_linear": 4.0, "gdn_linear": 3.0, "attention_mixer": 15.0,
           "gdn_mixer": 9.0, "selection": 2.0}  # fmt: skip
    split = components(raw, total_ms=50.0)
    assert split == {"projections_mlp": 30.0, "attention": 9.0, "selection": 2.0, "gdn_core": 6.0, "other": 3.0}
    assert list(split) == list(COMPONENTS)
    assert shares(split)["projections_mlp"] == pytest.approx(0.6)


def test_clock_rejects_open_regions():
    clock = ComponentClock(CPU)
    clock.start("a")
    with pytest.raises(ValueError, match="still open"):
        clock.totals_ms()


def test_regions_are_the_same_for_transformers_and_ours(pair):
    """Both models expose 2 GDN mixers, 2 attention mixers and 4 MLPs; linears inside an MLP are not timed apart."""
    for model in (pair.hf, pair.ours):
        names = [n for _, ns in regions_of(model) for n in ns]
        assert names.count("gdn_mixer") == 2 and names.count("attention_mixer") == 2 and names.count("mlp") == 4
        assert names.count("attention_linear") == 8  # q, k, v, o per attention layer
        assert names.count("gdn_linear") == 2 * 5  # in_proj_qkv, _z, _b, _a and out_proj
        assert names.count("linear") == 8 + 10 + 1  # the mixers' and the LM head


def test_breakdown_adds_up_and_times_selection_only_where_blocks_are_chosen(pair):
    model = pair.ours
    ids = torch.randint(0, 101, (150,), generator=torch.Generator().manual_seed(1))
    call = suite._ours_call(model, ids, 4, {})
    model.set_modes(ExecutionModes(), sparse_attention_config=pair.sparse)
    with torch.inference_mode():
        dense = breakdown(model, call, CPU)
    assert dense["selection"] == 0.0 and dense["gdn_core"] > 0 and dense["attention"] > 0
    assert sum(dense[c] for c in COMPONENTS) == pytest.approx(dense["total"])
    assert 0 < dense["gdn_kernel"] < dense["gdn_core"]  # the recurrence, inside the GDN layers' own time
    forecast = ForecastProjections.random(model.config)
    model.set_modes(ExecutionModes(attention="sparda"), sparse_attention_config=pair.sparse, forecast=forecast)
    backends = [layer.mixer.backend for layer in model.model.layers if hasattr(layer, "self_attn")]
    with torch.inference_mode():
        sparda = breakdown(model, call, CPU)
    assert sparda["selection"] > 0
    after = [layer.mixer.backend for layer in model.model.layers if hasattr(layer, "self_attn")]
    assert after == backends and all(type(b) is SpardaAttention for b in after)  # instrumentation undone
    cores = [layer.mixer.core for layer in model.model.layers if hasattr(layer.mixer, "core")]
    assert cores and all(type(c).__name__ == "DenseGDN" for c in cores)


def test_end_to_end_on_a_tiny_hybrid(tmp_path):
    """Every mode runs on the CPU (T = 97, past the tiny sparse geometry's dense length), dense matches transformers
    in float32, the approximate modes are compared with dense, decode runs at batch 1 and 3 for every mode, the
    summary has the issue's keys and the plots are written."""
    import_qwen35()
    assert _run(tmp_path, "--lengths", "97", "--contexts", "81", "--batches", "1,3") == 0
    data = _rows(tmp_path)
    rows = {(r["phase"], r["mode"], r["B"]): r for r in data["rows"]}
    for mode in MODES:
        r = rows[("prefill", mode, 1)]
        assert "error" not in r and r["ms"] > 0 and r["checks_pass"] is True
        assert set(r["breakdown_ms"]) == set(COMPONENTS)
    assert rows[("prefill", "dense", 1)]["check_rel_vs_hf"] < 1e-4
    assert rows[("prefill", "hf", 1)]["hf_gdn_kernel"] == "torch fallback"
    assert rows[("prefill", "hf", 1)]["hf_conv_kernel"] in ("causal_conv1d", "torch fallback")
    assert rows[("prefill", "dense", 1)]["dense_gdn_kernel"] == "torch"  # FLA runs on CUDA only
    assert rows[("prefill", "sparse_gdn", 1)]["dense_gdn_kernel"] is None
    assert 0 < rows[("prefill", "sparse_gdn", 1)]["check_rel_vs_dense"] < 0.5
    assert rows[("prefill", "sparda", 1)]["breakdown_ms"]["selection"] > 0
    assert "RANDOM" in rows[("prefill", "sparda", 1)]["note"]
    for mode in DECODE_MODES:
        for B in (1, 3):
            assert rows[("decode", mode, B)]["tokens_per_s"] > 0
    assert rows[("decode", "hf", 3)]["check_hf_cache_tokens_ok"] is True
    compiled = rows[("decode", "hf_compiled", 1)]  # over a StaticCache (not compiled off the GPU: transformers' rule)
    assert compiled["checks_pass"] is True and compiled["check_rel_vs_hf"] < 1e-4 and compiled["compile_s"] > 0
    assert rows[("decode", "hf_compiled", 3)]["check_hf_cache_tokens_ok"] is True
    assert rows[("decode", "dense", 1)]["check_rel_vs_hf"] < 1e-4  # the first step over the copied caches
    assert rows[("decode", "hf", 1)]["check_step_vs_forward"] < 1e-4  # float32: step = forward pass
    assert rows[("decode", "dense", 1)]["check_tol"] == DENSE_TOL
    assert rows[("decode", "sparse", 1)]["check_rel_vs_dense"] >= 0
    for key in ("prefill_speedup_vs_hf_128k_qwen35_4b", "prefill_speedup_vs_own_dense_128k_qwen35_4b",
                "gdn_share_of_prefill_128k_dense", "attn_share_of_prefill_128k_dense",
                "decode_speedup_vs_hf_b16_32k_qwen35_4b", "decode_speedup_vs_hf_best_b16_32k_qwen35_4b",
                "prefill_speedup_vs_hf_best_128k_qwen35_4b"):  # fmt: skip
        assert key in data["summary"]
    assert data["summary"]["prefill"]["tiny-qwen3.5"]["97"]["sparse"]["speedup_vs_dense"] > 0
    assert (tmp_path / "plots" / "model_tiny_qwen35.png").stat().st_size > 0
    assert (tmp_path / "plots" / "model_decode_tiny_qwen35.png").stat().st_size > 0
    (tmp_path / "plots" / "model_tiny_qwen35.png").unlink()
    assert main(["bench", "--out", str(tmp_path), "model", "--report"]) == 0  # redrawn from the file alone
    assert (tmp_path / "plots" / "model_tiny_qwen35.png").stat().st_size > 0


def test_a_failing_mode_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    real = suite._prefill_case

    def failing(row, ctx, mode, ids):
        if mode == "sparse_gdn":
            raise RuntimeError("injected failure")
        return real(row, ctx, mode, ids)

    monkeypatch.setattr(suite, "_prefill_case", failing)
    import_qwen35()
    _run(tmp_path, "--phase", "prefill", "--lengths", "77", "--modes", "dense,sparse_gdn,sparse", "--no-breakdown")
    rows = {r["mode"]: r for r in _rows(tmp_path)["rows"]}
    assert rows["sparse_gdn"]["error"] == "RuntimeError" and "injected" in rows["sparse_gdn"]["detail"]
    assert rows["dense"]["ms"] > 0 and rows["sparse"]["ms"] > 0


def test_an_abort_keeps_the_finished_rows_on_disk(tmp_path, monkeypatch):
    """A hard stop (a timeout's KeyboardInterrupt) mid-run: the rows finished before it are already in the file."""
    real = suite._prefill_case

    def aborting(row, ctx, mode, ids):
        if mode == "sparse":
            raise KeyboardInterrupt
        return real(row, ctx, mode, ids)

    monkeypatch.setattr(suite, "_prefill_case", aborting)
    import_qwen35()
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, "--phase", "prefill", "--lengths", "77", "--modes", "dense,sparse_gdn,sparse", "--no-breakdown")
    rows = {r["mode"]: r for r in _rows(tmp_path)["rows"]}
    assert rows["dense"]["ms"] > 0 and rows["sparse_gdn"]["ms"] > 0
    assert "ms" not in rows["sparse"] and rows["sparse"]["error"] == "interrupted"


def test_time_box_reports_a_slow_warm_up_alone_and_skips_longer_lengths(tmp_path):
    import_qwen35()
    _run(tmp_path, "--phase", "prefill", "--lengths", "70,97", "--modes", "dense", "--max-call-s", "1e-6")
    short, long = _rows(tmp_path)["rows"]
    assert short["reps"] == 0 and short["ms"] == short["warmup_ms"] and "timing_note" in short
    assert "breakdown_ms" not in short and short["checks_pass"] is None  # no transformers row to compare with
    assert long["T"] == 97 and long["skipped"].startswith("projected call time")


def test_a_checkpoint_folder_runs_in_place_of_a_geometry(tmp_path):
    """``--model PATH``: a tiny Llama checkpoint written by transformers, loaded by both sides."""
    from tests.tiny_models import build, save

    path = save(build("llama-gqa-bias", seed=5), tmp_path / "ckpt")
    with one_thread():
        main(["bench", "--out", str(tmp_path), "model", "--model", str(path), "--phase", "prefill", "--lengths", "33",
              "--modes", "hf,dense", "--reps", "1", "--no-breakdown", "--device", "cpu"])  # fmt: skip
    rows = {r["mode"]: r for r in _rows(tmp_path)["rows"]}
    assert rows["dense"]["geometry"] == f"model:{path}"
    assert rows["dense"]["check_rel_vs_hf"] < 1e-4 and rows["dense"]["checks_pass"] is True


def test_append_merges_runs_and_replaces_rows_with_the_same_key(tmp_path):
    def log(append):
        return RowLog(tmp_path, "m", ROW_KEY, lambda rows: {"rows": len(rows)}, append=append)

    first = log(append=False)
    first.start(geometry="g", phase="prefill", mode="dense", T=8, B=1)["ms"] = 1.0
    first.start(geometry="g", phase="prefill", mode="sparse", T=8, B=1)["ms"] = 2.0
    first.note("from the first run")
    first.save()
    second = log(append=True)
    second.start(geometry="g", phase="prefill", mode="sparse", T=8, B=1)["ms"] = 3.0
    second.start(geometry="g", phase="decode", mode="dense", T=8, B=4)["tokens_per_s"] = 5.0
    second.save()
    data = json.loads((tmp_path / "m.json").read_text())
    got = {(r["phase"], r["mode"]): r for r in data["rows"]}
    assert len(data["rows"]) == 3 and got[("prefill", "dense")]["ms"] == 1.0 and got[("prefill", "sparse")]["ms"] == 3.0
    assert data["summary"] == {"rows": 3} and "from the first run" in data["notes"]
    assert len(data["environment"]["previous_runs"]) == 1
    log(append=False).save()  # without append the file starts afresh
    assert json.loads((tmp_path / "m.json").read_text())["rows"] == []
    with pytest.raises(ValueError, match="key fields"):
        log(append=True).start(geometry="g", phase="prefill")


def _prefill(mode, ms, **extra):
    return dict(geometry="qwen3.5-4b", phase="prefill", mode=mode, T=131072, B=1, ms=ms, checks_pass=True, **extra)


def test_summary_headlines_need_dense_to_match_transformers():
    share = {"projections_mlp": 0.4, "attention": 0.35, "selection": 0.0, "gdn_core": 0.2, "other": 0.05}
    rows = [
        _prefill("hf", 6000.0),
        _prefill("dense", 5000.0, breakdown_share=share),
        _prefill("sparse", 2000.0),
        _prefill("sparda", 1500.0),
        dict(geometry="qwen3.5-4b", phase="decode", mode="dense", T=32768, B=1, tokens_per_s=9.0, checks_pass=True),
        dict(geometry="qwen3.5-4b", phase="decode", mode="hf", T=32768, B=16, tokens_per_s=100.0),
        dict(geometry="qwen3.5-4b", phase="decode", mode="sparse", T=32768, B=16, tokens_per_s=250.0),
        dict(geometry="qwen3.5-4b", phase="decode", mode="dense", T=32768, B=64, error="does not fit"),
        dict(geometry="qwen3.5-4b", phase="decode", mode="hf_compiled", T=32768, B=16, tokens_per_s=125.0,
             checks_pass=True),
        dict(geometry="qwen3.5-4b", phase="decode", mode="hf_compiled", T=32768, B=1, tokens_per_s=99.0,
             checks_pass=False),
        dict(geometry="qwen3.5-4b", phase="decode", mode="hf", T=32768, B=1, tokens_per_s=10.0),
    ]  # fmt: skip
    s = summarise(rows)
    # the fastest of transformers' configurations is the peer of the _hf_best_ keys; one that failed its check is not
    assert (
        s["decode_speedup_vs_hf_best_b16_32k_qwen35_4b"] == 2.0
        and s["decode_hf_best_b16_32k_qwen35_4b"] == "hf_compiled"
    )
    assert s["decode"]["qwen3.5-4b"]["32K_b1"]["dense"]["speedup_vs_hf_best"] == 0.9
    assert s["prefill_speedup_vs_hf_best_128k_qwen35_4b"] == 3.0
    assert s["prefill_speedup_vs_hf_128k_qwen35_4b"] == 3.0
    assert s["prefill_speedup_vs_own_dense_128k_qwen35_4b"] == 2.5
    assert s["prefill_speedup_vs_hf_128k_qwen35_4b_sparda"] == 4.0
    assert s["gdn_share_of_prefill_128k_dense"] == 0.2 and s["attn_share_of_prefill_128k_dense"] == 0.35
    assert s["decode_speedup_vs_hf_b16_32k_qwen35_4b"] == 2.5
    assert s["prefill"]["qwen3.5-4b"]["128K"]["fastest_meaningful"] == "sparse"  # sparda is faster, but random
    failed = dict(geometry="qwen3.5-4b", phase="fp32_check", mode="dense", T=8192, B=1, checks_pass=False)
    s = summarise([*rows, failed])  # ours less accurate than transformers: nothing is trusted
    assert s["prefill_speedup_vs_hf_128k_qwen35_4b"] is None and s["decode_speedup_vs_hf_b16_32k_qwen35_4b"] is None
    assert summarise([*rows, dict(failed, checks_pass=True)])["prefill_speedup_vs_hf_128k_qwen35_4b"] == 3.0
    rows[1]["checks_pass"] = False  # ours-dense disagreed with transformers: no prefill speedup is trusted
    rows[4]["checks_pass"] = False  # nor any decode speedup at that context
    s = summarise(rows)
    assert (
        s["prefill_speedup_vs_hf_128k_qwen35_4b"] is None and s["prefill_speedup_vs_own_dense_128k_qwen35_4b"] is None
    )
    assert s["decode_speedup_vs_hf_b16_32k_qwen35_4b"] is None
    assert s["decode_speedup_vs_hf_best_b16_32k_qwen35_4b"] is None


def test_a_case_projected_past_the_time_box_is_skipped():
    rows = [dict(geometry="g", phase="prefill", mode="hf", T=1000, warmup_ms=60000.0, ms=2000.0)]
    assert suite._projected_s(rows, "g", "hf", 4000) == pytest.approx(32.0)
    assert suite._projected_s(rows, "g", "dense", 4000) is None


@pytest.mark.gpu
def test_qwen35_4b_geometry_on_the_gpu(tmp_path):
    """Real Qwen3.5-4B shapes at 8K tokens: ours-dense within bf16 tolerance of transformers and no further from
    transformers' float32 forward than transformers' bf16 one, peak memory recorded, every mode runs; decode at batch
    1 and 2 for every mode."""
    out = tmp_path
    args = ["--geometry", "qwen3.5-4b", "--lengths", "8192", "--reps", "1", "--contexts", "8192", "--batches", "1,2",
            "--decode-steps", "2", "--decode-warmup", "1", "--fp32-check-len", "8192"]  # fmt: skip
    assert main(["bench", "--out", str(out), "model", *args]) == 0
    rows = {(r["phase"], r["mode"], r["B"]): r for r in _rows(out)["rows"]}
    assert rows[("fp32_check", "dense", 1)]["checks_pass"] is True
    assert rows[("prefill", "dense", 1)]["checks_pass"] is True
    assert rows[("decode", "dense", 1)]["checks_pass"] is True
    if importlib.util.find_spec("fla") is not None:  # transformers runs FLA's kernels, as users do
        assert rows[("prefill", "hf", 1)]["hf_gdn_kernel"] == "fla"
    for mode in MODES:
        assert rows[("prefill", mode, 1)]["peak_gib"] > 0
    for mode in DECODE_MODES:
        assert rows[("decode", mode, 2)]["tokens_per_s"] > 0


@pytest.mark.gpu
def test_minicpm_geometry_prefill_on_the_gpu(tmp_path):
    """MiniCPM4.1-8B shapes (a Llama-architecture model) at 8K tokens: ours-dense within bf16 tolerance of
    transformers and as close to transformers' float32 forward as transformers' bf16 one; the GDN-only mode is
    skipped with its reason."""
    args = ["--geometry", "minicpm4.1-8b", "--phase", "prefill", "--lengths", "8192", "--reps", "1",
            "--fp32-check-len", "8192"]  # fmt: skip
    assert main(["bench", "--out", str(tmp_path), "model", *args]) == 0
    rows = {(r["phase"], r["mode"]): r for r in _rows(tmp_path)["rows"]}
    assert rows[("fp32_check", "dense")]["checks_pass"] is True
    rows = {mode: r for (phase, mode), r in rows.items() if phase == "prefill"}
    assert rows["dense"]["checks_pass"] is True and rows["sparse"]["ms"] > 0
    assert rows["sparse_gdn"]["skipped"] == "the model has no GDN layers"


def test_the_decode_check_allows_the_drift_transformers_itself_shows():
    """In bf16 a decode step drifts from a forward pass over the same tokens (5.8 % for transformers at Qwen3.5-4B
    geometry): ours-dense's decode check allows twice transformers' own drift of the run, and only where one was
    measured; the prefill check keeps DENSE_TOL."""
    pair = SimpleNamespace(ours=SimpleNamespace(config=SimpleNamespace(gdn_layers=[1])))
    ctx = Context(pair, None, CPU, torch.float32, None)
    hf = torch.ones(50)
    off = hf + 0.12 * torch.linspace(-1, 1, 50) / torch.linspace(-1, 1, 50).norm() * hf.norm()  # 12 % away
    decode, prefill = ("decode", 8192), ("prefill", 8192)
    for case in (decode, prefill):
        ctx.refs[(case, "hf")] = hf
    ctx.hf_step_drift[decode] = 0.07
    rows = {case: {} for case in (decode, prefill)}
    for case, row in rows.items():
        check_logits(row, ctx, "dense", case, off)
    assert rows[decode]["check_rel_vs_hf"] == pytest.approx(0.12, rel=1e-4)
    assert rows[decode]["check_tol"] == pytest.approx(2 * 0.07) and rows[decode]["checks_pass"] is True
    assert rows[prefill]["check_tol"] == DENSE_TOL and rows[prefill]["checks_pass"] is False


@pytest.mark.parametrize("mode", ["dense", "sparse", "sparda"])
def test_graph_step_of_a_hybrid_decodes_what_the_runner_decodes(pair, mode):
    """The CUDA-graph stepper's step function (run here without a graph) on the tiny Qwen3.5 hybrid, its GDN states
    carried: the same logits as eager ``ModelRunner.decode`` steps over the same caches, past a block boundary."""
    from longsparse.bench.model_decode import _ours_caches, _replicate
    from longsparse.engine.decode_graph import GraphStepper
    from longsparse.engine.runner import ModelRunner

    ctx = Context(pair, SimpleNamespace(), CPU, torch.float32, None)
    ctx.set_mode(mode)
    runner = ModelRunner(pair.ours)
    prompt, capacity, steps = 120, 160, 12  # the tiny sparse geometry's blocks are 16 tokens: 120 -> 132 crosses
    ids = torch.randint(0, 101, (prompt + 1,), generator=torch.Generator().manual_seed(5)).tolist()
    with one_thread(), torch.inference_mode():
        source = _ours_caches(ctx, mode, 1, capacity)
        runner.prefill([ids[:prompt]], slots=[0], kv_cache=source[0], gdn_states=source[1], compressed_keys=source[2])
        runs = {}
        for kind in ("runner", "graph"):
            kv, states, ck = caches = _ours_caches(ctx, mode, 2, capacity)
            _replicate(source, caches)
            tokens, lengths, logits = [ids[prompt]] * 2, [prompt] * 2, []
            if kind == "graph":
                stepper = GraphStepper(pair.ours, kv, ck, torch.tensor(tokens), lengths, capacity, mode == "dense",
                                       capture=False, gdn_states=states)  # fmt: skip
                logits = [stepper.step().clone() for _ in range(steps)]
            else:
                for _ in range(steps):
                    out = runner.decode(tokens, prefix_lens=lengths, slots=[0, 1], kv_cache=kv, gdn_states=states,
                                        compressed_keys=ck)  # fmt: skip
                    logits.append(out.logits)
                    tokens, lengths = out.logits.argmax(-1).tolist(), [n + 1 for n in lengths]
            runs[kind] = torch.stack(logits)
    assert torch.allclose(runs["graph"], runs["runner"], atol=1e-5, rtol=1e-5)


def test_tile_tokens_reach_the_block_sparse_prefill_and_are_checked(tmp_path, capsys):
    """``--tile-tokens`` sets the sparse modes' prefill tiles (noted in the results); an impossible value is refused
    before any model is built."""
    import_qwen35()
    assert _run(tmp_path, "--lengths", "97", "--phase", "prefill", "--modes", "dense,sparse", "--tile-tokens", "8") == 0
    data = _rows(tmp_path)
    assert any("tiles of 8 query tokens" in n for n in data["notes"])
    assert {r["mode"]: r.get("checks_pass") for r in data["rows"]}["sparse"] is True
    capsys.readouterr()
    assert _run(tmp_path, "--lengths", "97", "--tile-tokens", "3") == 2
    assert "longsparse bench: error: tile_tokens must be None or a power of two" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3.5"])
def test_reference_model_keeps_its_rotary_frequencies_in_float32(name):
    """transformers' model in bf16 as ``from_pretrained(dtype=bf16)`` gives it: bf16 weights, float32 rotary
    ``inv_freq`` (a bf16 ``inv_freq`` turns rotary angles radians wrong at long context); and its logits agree with
    ours over ~1K tokens as well as two bf16 models can."""
    if name == "tiny-qwen3.5":
        import_qwen35()
    pair = build_pair(GEOMETRIES[name], CPU, torch.bfloat16, seed=3)
    assert {p.dtype for p in pair.hf.parameters()} == {torch.bfloat16}
    buffers = {n: b.dtype for n, b in pair.hf.named_buffers() if "inv_freq" in n}
    assert buffers and set(buffers.values()) == {torch.float32}
    ids = torch.randint(0, GEOMETRIES[name].config["vocab_size"], (1031,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), one_thread():
        ours = pair.ours.compute_logits(pair.ours(ids, ForwardBatch.prefill([1031], CPU))[-16:])
        hf = pair.hf(input_ids=ids[None], use_cache=False, logits_to_keep=16).logits[0].float()
    assert rel_err(ours, hf) < 0.03


def test_fp32_check_compares_both_bf16_models_with_transformers_in_float32(tmp_path):
    """A bf16 tiny hybrid on the CPU: the row records both bf16 models' distance from transformers' float32 forward
    and passes (ours is as accurate as transformers); transformers' weights are back in bf16, bit for bit, after the
    float32 pass; a float32 run has nothing to check."""
    import_qwen35()
    pair = build_pair(GEOMETRIES["tiny-qwen3.5"], CPU, torch.bfloat16, seed=3)
    before = {n: p.clone() for n, p in pair.hf.state_dict().items()}
    log = RowLog(tmp_path, "m", ROW_KEY, summarise)
    ctx = Context(pair, SimpleNamespace(check_rows=8, seed=0), CPU, torch.bfloat16, log)
    with one_thread():
        suite.run_fp32_check(ctx, 97)
    row = log.result.rows[0]
    assert row["phase"] == "fp32_check" and "error" not in row
    assert 0 < row["hf_rel_vs_fp32"] < 0.1 and 0 < row["check_rel_vs_fp32"] < 0.1
    assert row["checks_pass"] is (row["check_rel_vs_fp32"] <= row["check_factor"] * row["hf_rel_vs_fp32"])
    assert row["checks_pass"] is True
    after = pair.hf.state_dict()
    assert all(after[n].dtype == t.dtype and torch.equal(after[n], t) for n, t in before.items())
    assert summarise(log.result.rows)["fp32_check"]["tiny-qwen3.5"]["checks_pass"] is True
    ctx32 = Context(pair, SimpleNamespace(check_rows=8, seed=0), CPU, torch.float32, log)
    suite.run_fp32_check(ctx32, 97)
    assert log.result.rows[-1]["skipped"] == "the run is in float32 already"
