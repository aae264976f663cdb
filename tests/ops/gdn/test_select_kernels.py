"""The GPU selector (three Triton launches, or one for short sequences) makes exactly the specification's decisions,
in every selection mode.

On the CPU the kernels run in Triton's interpreter; the inputs are the selector's own (tail scores, chunk decays,
the output gate), so the comparison is exact: same mask, tiers, tier sizes and (n_H, n_M)."""

import pytest
import torch

from longsparse.ops._triton import kernels_can_run_on
from longsparse.ops.gdn import SparseGDNConfig, SparseGDNKernelConfig
from longsparse.ops.gdn.layout import build_layout
from longsparse.ops.gdn.spec.events import decay_prefixes
from longsparse.ops.gdn.spec.select import select_events

gpu_select = pytest.importorskip("longsparse.ops.gdn.select", reason="needs triton")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() or kernels_can_run_on(torch.device("cpu"))), reason="no GPU and no interpreter"
)

CASES = {
    # lengths, value heads, group size, V
    "varlen-empty-and-one-chunk-HV32-G2": ([64 * 14 + 5, 64 * 3, 64, 1, 64 * 9 + 30], 32, 2, 16),
    "HV8-G4": ([64 * 20], 8, 4, 8),
    "P3-G2": ([64 * 40 + 1, 64 * 7], 6, 2, 8),
    "empty-and-128-chunks-HV32": ([64 * 5, 0, 64 * 127 + 3], 32, 2, 16),  # the one-launch form's longest sequences
    "ties-HV8-G2": ([64 * 50, 64 * 9], 8, 2, 8),  # scores rounded to 0..3: many chunks share q (lower index first)
}
MODES = [
    ("varlen-empty-and-one-chunk-HV32-G2", "adaptive"),
    ("P3-G2", "adaptive"),
    ("empty-and-128-chunks-HV32", "adaptive"),
    ("ties-HV8-G2", "adaptive"),
] + [("HV8-G4", mode) for mode in ("adaptive", "random", "all", "fixed_tiers")]


FORMS = {  # select_events_gpu keywords: one launch; three at the default blocks; small blocks with the bisection
    "three-launches": dict(short=False),
    "one-launch": dict(short=True),
    "three-launches-small-blocks-bisection": dict(short=False, blocks=gpu_select.SelectorBlocks(stats=16, sort_max=1)),
}


RUNS = [  # the small blocks on the 128-chunk case would take the interpreter a minute; the varlen case has them
    (case, selection, form)
    for form in FORMS
    for case, selection in MODES
    if not (form.endswith("bisection") and case.endswith("128-chunks-HV32"))
]


@pytest.mark.parametrize("case, selection, form", RUNS, ids=["-".join(run) for run in RUNS])
def test_gpu_selector_equals_specification(case, selection, form):
    """Small blocks spread every sequence over several head_stats programs (their sums over blocks, the decay
    prefix's carry); ``sort_max=1`` makes pair_rank find the thresholds by bisection, as for long sequences."""
    lengths, HV, G, V = CASES[case]
    gen = torch.Generator().manual_seed(len(case))
    T = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    layout = build_layout(1, T, cu, "cpu")
    score = torch.rand(layout.NC, HV, generator=gen) * torch.rand(1, HV, generator=gen) * 3
    if case.startswith("ties"):
        score = score.round()
    gamma = -torch.rand(layout.NC, HV, generator=gen) * torch.rand(1, HV, generator=gen) * 3
    gate = torch.randn(1, T, HV, V, generator=gen) * torch.rand(HV, 1, generator=gen) * 3
    w = 0.5 + torch.rand(V, generator=gen)
    for visibility in (True, False):
        cfg = SparseGDNConfig(selection=selection, visibility=visibility, seed=12345)
        want = select_events(layout, score.T.contiguous(), gamma.T.contiguous(), G, cfg, gate, w)
        args = (build_layout(1, T, cu.to(DEV), DEV), score.to(DEV), gamma.to(DEV), G, cfg, gate.to(DEV), w.to(DEV))
        got = gpu_select.select_events_gpu(*args, **FORMS[form])
        for name in ("mask", "tier", "tier_k", "n_high", "n_mid"):
            assert torch.equal(getattr(got, name).cpu(), getattr(want, name)), (name, visibility)
        for name in ("gain_mid", "gain_high"):  # the normalised gains the statistics report
            assert torch.allclose(getattr(got, name).cpu().double(), getattr(want, name).double(), rtol=1e-5), name
        if selection == "adaptive":  # the main pass's call: the same mask and the decay prefix, nothing else
            prefix = torch.full((layout.NC, HV), float("nan"), dtype=torch.float64, device=DEV)
            lean = gpu_select.select_events_gpu(*args, details=False, decay_prefix=prefix, **FORMS[form])
            assert lean.mask.dtype == torch.bool and torch.equal(lean.mask.cpu(), want.mask)
            assert lean.tier is None and lean.gain_high is None
            want_prefix = decay_prefixes(layout, gamma.T)[0].T  # the specification's P_c, [NC, HV]
            assert torch.allclose(prefix.cpu(), want_prefix, rtol=1e-13, atol=1e-12), visibility


def test_short_selector_lifetimes_equal_the_three_launches():
    """The one-launch selector reports the same lifetimes L_h as the three launches (the statistics' field)."""
    lengths, HV, G, V = CASES["P3-G2"]
    T = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=DEV)
    layout = build_layout(1, T, cu, DEV)
    gen = torch.Generator().manual_seed(7)
    score = torch.rand(layout.NC, HV, generator=gen).to(DEV)
    gamma = (-torch.rand(layout.NC, HV, generator=gen) * 0.1).to(DEV)
    args = (layout, score, gamma, G, SparseGDNConfig(visibility=False))
    one, three = (gpu_select.select_events_gpu(*args, short=short) for short in (True, False))
    assert torch.allclose(one.lifetime, three.lifetime, rtol=1e-6)
    assert torch.equal(one.mask, three.mask)


def test_the_op_runs_the_selector_its_config_names(monkeypatch):
    """``SparseGDNKernelConfig.select_kernel``: "three" launches three kernels, "one" one, "auto" (the
    default) one for one sequence up to ``AUTO_SHORT_CHUNKS`` chunks and three otherwise; the masks are the same."""
    launch = pytest.importorskip("longsparse.ops.gdn.launch")
    seen = []
    real = gpu_select.select_events_gpu
    monkeypatch.setattr(gpu_select, "select_events_gpu", lambda *a, **k: seen.append(k["short"]) or real(*a, **k))
    HV, G = 4, 2
    masks = {}
    for lengths in ([64 * 3 + 5, 64], [64 * (gpu_select.SHORT_CHUNKS + 1)]):
        plan = launch.plan_launch(1, sum(lengths), torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]), DEV)
        gen = torch.Generator().manual_seed(3)
        score = torch.rand(plan.layout.NC, HV, generator=gen).to(DEV)
        gamma = (-torch.rand(plan.layout.NC, HV, generator=gen) * 0.1).to(DEV)
        for kernel in ("three", "one", "auto"):
            if kernel == "one" and plan.layout.Cmax > gpu_select.SHORT_CHUNKS:
                continue
            cfg, kernel_cfg = SparseGDNConfig(visibility=False), SparseGDNKernelConfig(select_kernel=kernel)
            masks[len(lengths), kernel] = launch.run_selection(
                plan, score, gamma, HV // G, cfg, kernel_config=kernel_cfg
            )[0].mask
    assert SparseGDNKernelConfig().select_kernel == "auto"
    assert seen == [False, True, None, False, None]
    assert torch.equal(masks[2, "three"], masks[2, "one"]) and torch.equal(masks[2, "three"], masks[2, "auto"])
    assert torch.equal(masks[1, "three"], masks[1, "auto"])


def test_auto_takes_one_launch_for_one_short_sequence_only():
    """``select_kernel="auto"``: one launch for a single sequence of at most ``AUTO_SHORT_CHUNKS`` chunks (where the
    H200 measured it faster); several sequences, or a longer one, take the three launches."""
    assert gpu_select.AUTO_SHORT_CHUNKS <= gpu_select.SHORT_CHUNKS  # the one launch's own limit
    limit = 64 * gpu_select.AUTO_SHORT_CHUNKS
    assert gpu_select.auto_takes_one_launch(build_layout(1, limit, None, "cpu"))
    assert gpu_select.auto_takes_one_launch(build_layout(1, 100, None, "cpu"))
    assert not gpu_select.auto_takes_one_launch(build_layout(1, limit + 1, None, "cpu"))
    assert not gpu_select.auto_takes_one_launch(build_layout(2, 100, None, "cpu"))
    assert not gpu_select.auto_takes_one_launch(build_layout(1, 300, torch.tensor([0, 100, 300]), "cpu"))


def test_selector_blocks_must_be_powers_of_two():
    with pytest.raises(ValueError, match="rank_warps must be a power of two, got 12"):
        gpu_select.SelectorBlocks(rank_warps=12)
    with pytest.raises(ValueError, match="stats must be a power of two, got 0"):
        gpu_select.SelectorBlocks(stats=0)


def test_the_short_selector_refuses_long_sequences():
    layout = build_layout(1, 64 * (gpu_select.SHORT_CHUNKS + 1), None, "cpu")
    score = torch.rand(layout.NC, 4)
    with pytest.raises(ValueError, match="at most"):
        gpu_select.select_events_gpu(layout, score, -score, 2, SparseGDNConfig(), short=True)


def test_long_sequences_fall_back_to_the_specification():
    layout = build_layout(1, 64 * (gpu_select.MAX_SORT_CHUNKS + 1), None, "cpu")
    assert "exceeds" in gpu_select.supports(layout)
