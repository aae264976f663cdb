"""`longsparse bench gdn` needs a GPU to time anything; on the CPU: how its rows name the main-pass variants, what
traffic its achieved bandwidths count, and how its summary reads rows from one run or several."""

import argparse
import dataclasses

import torch

import longsparse.bench.gdn as gdn_bench
from longsparse.bench.gdn import HV, D, H, alike_keys, choices, configure, floor_bytes, stage_bytes, summarise, variant
from longsparse.ops.gdn import SparseGDNKernelConfig
from longsparse.reports.results import RowLog


def test_variant_names_say_what_differs_from_the_defaults():
    base = SparseGDNKernelConfig()
    tile = next(bv for bv in (32, 64) if bv != base.block_v)  # a value tile other than the default
    assert variant(base) == "walk"
    assert variant(dataclasses.replace(base, main_pass="csr", block_v=16)) == "csr_bv16"
    assert variant(dataclasses.replace(base, main_warps=8)) == "walk_w8"
    assert variant(dataclasses.replace(base, walk_output_role=False)) == "walk_norole"  # the role is the default
    assert variant(dataclasses.replace(base, walk_output_role=True)) == "walk"
    assert variant(dataclasses.replace(base, block_v=tile, main_warps=8)) == f"walk_bv{tile}_w8"
    assert variant(dataclasses.replace(base, block_v=base.block_v, main_warps=8)) == "walk_w8"
    other = next(c for c in ("w", "ks") if c != base.walk_correction)
    assert variant(dataclasses.replace(base, walk_correction=other, block_v=tile)) == f"walk_{other}_bv{tile}"
    assert variant(dataclasses.replace(base, main_pass="csr", walk_correction=other)) == "csr"  # one csr form
    for where in ("inline", "stored"):  # the default picks one of them by length: both are named
        assert base.walk_scores == "auto" and variant(dataclasses.replace(base, walk_scores=where)) == f"walk_{where}"


def test_list_flags_take_distinct_allowed_values():
    assert choices("32,16", (16, 32, 64), int) == [32, 16]
    assert choices("walk", ("walk", "csr"), str) == ["walk"]
    for bad in ("", "32,32", "48", "x"):
        assert choices(bad, (16, 32, 64), int) is None


def test_stage_bytes_count_the_buffers_each_stage_reads_and_writes():
    """At 128K (2,048 chunks, one sequence): the stages' traffic from the sizes of the tensors they touch, per path."""
    T, NC = 131072, 2048

    def nbytes(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device="meta").nbytes

    q = k = nbytes(T, H, D)
    v = o = nbytes(T, HV, D)
    g = beta = nbytes(T, HV, dtype=torch.float32)
    state = nbytes(1, HV, D, D, dtype=torch.float32)
    tiles = nbytes(NC, HV, 128, 64)  # the Gluon walk's: scores, then the dense Ct (its only copy)
    scores, kept = nbytes(NC, HV, 64, 64), nbytes(NC, HV, 7, 16, 16)
    gluon = stage_bytes(1, T, NC, 1, scores_rows=128, kept_ct=False)
    assert gluon["intra"] == k + v // 2 + g + beta + q + tiles
    assert gluon["main"] == q + k + v + g + tiles + o + state
    stored = stage_bytes(1, T, NC, 1, scores_rows=64, kept_ct=True)
    assert stored["intra"] == k + v // 2 + g + beta + q + scores + kept
    assert stored["main"] == q + k + v + g + scores + kept + o + state
    inline = stage_bytes(1, T, NC, 1, scores_rows=None, kept_ct=True)
    assert inline["intra"] == k + v // 2 + g + beta + kept
    ct_only = stage_bytes(1, T, NC, 1, scores_rows=128, kept_ct=False, ct_only=True)  # the output role's own scores
    assert ct_only["intra"] == k + v // 2 + g + beta + tiles // 2
    assert ct_only["main"] == q + k + v + g + tiles // 2 + o + state
    # the op moves about twice the minimum of a prefill (q, k, v read once, o written once) on the Gluon path
    assert 2.0 < (gluon["intra"] + gluon["main"]) / floor_bytes(1, T) < 2.3


def test_alike_keys_are_unit_keys_close_to_one_direction_per_head():
    k = torch.nn.functional.normalize(torch.randn(2, 256, 4, 64), dim=-1).bfloat16()
    alike = alike_keys(k)
    assert alike.shape == k.shape and alike.dtype == k.dtype and alike.device == k.device
    x = alike.float()
    assert torch.allclose(x.norm(dim=-1), torch.ones(2, 256, 4), atol=1e-2)
    cos = torch.einsum("btnd,bsnd->nbts", x, x)  # per head, every pair of keys
    assert cos.mean() > 0.98 and cos.min() > 0.9
    between = torch.einsum("btd,btd->bt", x[:, :, 0], x[:, :, 1])  # two heads: their own directions
    assert between.abs().mean() < 0.5
    assert torch.equal(alike_keys(k), alike)  # seeded


def test_summary_takes_the_rows_of_several_runs_and_skips_a_cut_off_one(tmp_path):
    """``--append``: a run of the lengths and one of the batches build one file (rows keyed by (B, T), the later run's
    row replacing an earlier one); a row whose run was cut off (only its key and date) leaves the summary's keys
    None rather than failing."""
    names = ["walk", "walk_triton"]

    def row(B, T, fla, fqla, passed=True):
        return dict(B=B, T=T, speedup_vs_fla=fla, speedup_vs_flashqla=fqla, ours_peak_gib=1.0, fla_peak_gib=4.0,
                    keep_ratio=0.3, passed=passed, main_walk_ms=2.0, main_walk_triton_ms=3.0)  # fmt: skip

    first = RowLog(tmp_path, "gdn_core", ("B", "T"), lambda rows: summarise(rows, names))
    first.start(B=1, T=131072).update(row(1, 131072, 2.9, 0.97))
    first.start(B=1, T=4096)  # cut off here: the file holds the key and the date alone
    first.save()
    cut = summarise(first.result.rows, names)
    assert cut["speedup_vs_fla_128k"] == 2.9 and cut["speedup_vs_fla_4k"] is None
    assert cut["mem_ratio_vs_fla_128k"] == 0.25 and cut["main_walk_triton_vs_walk_128k"] == 2.0 / 3.0

    second = RowLog(tmp_path, "gdn_core", ("B", "T"), lambda rows: summarise(rows, names), append=True)
    second.start(B=1, T=4096).update(row(1, 4096, 1.8, 0.6))
    second.start(B=2, T=32768).update(row(2, 32768, 2.9, 1.2, passed=False))
    second.save()
    rows = second.result.rows
    assert sorted((r["B"], r["T"]) for r in rows) == [(1, 4096), (1, 131072), (2, 32768)]
    both = summarise(rows, names)
    assert both["speedup_vs_fla_4k"] == 1.8 and both["speedup_vs_flashqla_128k"] == 0.97
    assert both["correctness_checked"] is False  # one failed row in either run withholds the claim
    assert summarise([], names)["speedup_vs_fla_128k"] is None


def test_bench_gdn_takes_append():
    parser = argparse.ArgumentParser()
    configure(parser)
    assert parser.parse_args([]).append is False and parser.parse_args(["--append"]).append is True


def test_bench_gdn_takes_rounds_and_refuses_fewer_than_one(capsys, monkeypatch):
    parser = argparse.ArgumentParser()
    configure(parser)
    assert parser.parse_args([]).rounds == 5 and parser.parse_args(["--rounds", "15"]).rounds == 15
    monkeypatch.setattr(gdn_bench.torch.cuda, "is_available", lambda: True)
    assert gdn_bench.run(parser.parse_args(["--rounds", "0"])) == 2
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().out


def test_summary_quotes_only_checked_rows_and_peers_that_passed_their_check():
    """A speedup comes from a row whose check ran and passed, against a peer whose own check passed; the best dense
    kernel is the fastest such peer; a missing or failing peer is named with the reason; ``correctness_checked``
    needs every quoted row (4K, 32K, 128K at B = 1, where measured) checked."""
    names = ["walk"]

    def row(T, passed=True, **peers):
        r = dict(B=1, T=T, ours_ms=2.0, passed=passed, fla_ms=6.0, speedup_vs_fla=3.0, fla_passed=True)
        for name, (ms, ok) in peers.items():
            r.update({f"{name}_ms": ms, f"speedup_vs_{name}": ms / 2.0, f"{name}_passed": ok,
                      f"{name}_vs_dense_rel": 0.004 if ok else 0.9})  # fmt: skip
        return r

    rows = [row(4096), row(32768, flashqla=(2.2, True), flashinfer=(1.8, False)),
            row(131072, flashqla=(2.4, True), flashinfer=(2.6, True))]  # fmt: skip
    s = summarise(rows, names)
    assert s["speedup_vs_flashinfer_128k"] == 1.3 and s["speedup_vs_flashqla_128k"] == 1.2
    assert s["speedup_vs_flashinfer_32k"] is None and s["speedup_vs_flashqla_32k"] == 1.1  # FlashInfer failed at 32K
    assert s["best_dense_128k"] == "flashqla" and s["speedup_vs_best_dense_128k"] == 1.2
    assert "flashinfer_unavailable" not in s and s["correctness_checked"] is True
    unchecked = [r if r["T"] != 131072 else {k: v for k, v in r.items() if k != "passed"} for r in rows]
    s = summarise(unchecked, names)  # the 128K row was not checked: nothing quoted from it
    assert s["speedup_vs_fla_128k"] is None and s["speedup_vs_best_dense_128k"] is None
    assert s["correctness_checked"] is False and s["speedup_vs_fla_4k"] == 3.0
    missing = [dict(r, peers_missing={"flashinfer": "import flashinfer.gdn_prefill failed: X"}) for r in rows[:1]]
    missing += [{k: v for k, v in r.items() if not k.startswith(("flashinfer", "speedup_vs_flashinfer"))} | {
        "peers_missing": {"flashinfer": "import flashinfer.gdn_prefill failed: X"}} for r in rows[1:]]  # fmt: skip
    s = summarise(missing, names)
    assert s["flashinfer_unavailable"] == "import flashinfer.gdn_prefill failed: X"
    assert s["speedup_vs_flashinfer_128k"] is None and s["best_dense_128k"] == "flashqla"
    failing = [rows[0], rows[1], row(131072, flashqla=(2.4, True), flashinfer=(2.6, False))]
    assert summarise(failing, names)["flashinfer_unavailable"].startswith("failed its correctness check: 0.9")
