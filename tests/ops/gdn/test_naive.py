"""The two GDN references agree with each other, with FLA's own pure-torch reference, and reject bad input."""

import pytest
import torch

from longsparse.ops.gdn import naive_chunk_gated_delta_rule, naive_recurrent_gated_delta_rule
from tests.helpers import rel_err
from tests.ops.gdn.helpers import make_gdn_inputs

CASES = [
    # B, T, H, HV, K, V, initial state
    (1, 1, 1, 1, 8, 8, False),
    (1, 63, 2, 2, 16, 8, False),
    (2, 64, 2, 4, 16, 16, True),
    (2, 130, 2, 4, 16, 8, True),
    (1, 200, 1, 3, 8, 12, True),
]


def case_id(c):
    return f"B{c[0]}-T{c[1]}-H{c[2]}-HV{c[3]}-K{c[4]}-V{c[5]}" + ("-h0" if c[6] else "")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_chunk_equals_recurrent_float64(case):
    B, T, H, HV, K, V, with_state = case
    q, k, v, g, beta, h0 = make_gdn_inputs(B, T, H, HV, K, V, with_state=with_state)
    o_r, s_r = naive_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o_c, s_c = naive_chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert o_r.dtype == s_r.dtype == torch.float64
    assert rel_err(o_c, o_r) <= 1e-10
    assert rel_err(s_c, s_r) <= 1e-10


def test_state_is_omitted_unless_asked():
    q, k, v, g, beta, _ = make_gdn_inputs(1, 10, 1, 1, 4, 4)
    assert naive_recurrent_gated_delta_rule(q, k, v, g, beta)[1] is None
    assert naive_chunk_gated_delta_rule(q, k, v, g, beta)[1] is None


def test_recurrence_matches_hand_computation():
    """Two tokens, one head, K = V = 1: the recurrence written out by hand."""
    q = torch.tensor([0.5, -1.0], dtype=torch.float64).view(1, 2, 1, 1)
    k = torch.tensor([1.0, 2.0], dtype=torch.float64).view(1, 2, 1, 1)
    v = torch.tensor([3.0, -1.0], dtype=torch.float64).view(1, 2, 1, 1)
    g = torch.log(torch.tensor([0.5, 0.25], dtype=torch.float64)).view(1, 2, 1)
    beta = torch.tensor([0.5, 1.0], dtype=torch.float64).view(1, 2, 1)
    s = 0.5 * 2.0  # S0 = 2 decays by 0.5
    s = s + 1.0 * (0.5 * (3.0 - 1.0 * s))  # u = β (v − k S)
    o1 = 0.5 * s
    s = 0.25 * s
    s = s + 2.0 * (1.0 * (-1.0 - 2.0 * s))
    o2 = -1.0 * s
    h0 = torch.full((1, 1, 1, 1), 2.0, dtype=torch.float64)
    for fn in (naive_recurrent_gated_delta_rule, naive_chunk_gated_delta_rule):
        o, st = fn(q, k, v, g, beta, scale=1.0, initial_state=h0, output_final_state=True)
        torch.testing.assert_close(o.flatten(), torch.tensor([o1, o2], dtype=torch.float64))
        torch.testing.assert_close(st.flatten(), torch.tensor([s], dtype=torch.float64))


@pytest.mark.parametrize("case", CASES[1:4], ids=case_id)
def test_matches_fla_naive_reference(case):
    """FLA's pure-torch reference (float32 inside, no GVA, no varlen): expand q/k heads, compare at its precision."""
    fla_naive = pytest.importorskip("fla.ops.gated_delta_rule.naive")
    B, T, H, HV, K, V, with_state = case
    q, k, v, g, beta, h0 = make_gdn_inputs(B, T, H, HV, K, V, with_state=with_state)
    o, s = naive_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    qe, ke = q.repeat_interleave(HV // H, 2), k.repeat_interleave(HV // H, 2)
    o_f, s_f = fla_naive.naive_recurrent_gated_delta_rule(qe, ke, v, beta, g, initial_state=h0, output_final_state=True)
    assert rel_err(o_f, o) <= 1e-5 and rel_err(s_f, s) <= 1e-5
    o_fc, s_fc = fla_naive.naive_chunk_gated_delta_rule(qe, ke, v, g, beta, initial_state=h0, output_final_state=True)
    assert rel_err(o_fc, o) <= 1e-5 and rel_err(s_fc, s) <= 1e-5


@pytest.mark.parametrize(
    "fn", [naive_recurrent_gated_delta_rule, naive_chunk_gated_delta_rule], ids=["recurrent", "chunk"]
)
def test_varlen_equals_per_sequence_calls(fn):
    lengths = [1, 63, 130, 64]
    T = sum(lengths)
    q, k, v, g, beta, h0 = make_gdn_inputs(1, T, 2, 4, 8, 8, with_state=True, n_states=len(lengths))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    o, s = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        o_n, s_n = fn(
            q[:, a:b],
            k[:, a:b],
            v[:, a:b],
            g[:, a:b],
            beta[:, a:b],
            initial_state=h0[n : n + 1],
            output_final_state=True,
        )
        assert rel_err(o[:, a:b], o_n) <= 1e-12
        assert rel_err(s[n : n + 1], s_n) <= 1e-12


def test_varlen_chunk_equals_recurrent():
    cu = torch.tensor([0, 70, 71, 200])
    q, k, v, g, beta, h0 = make_gdn_inputs(1, 200, 2, 4, 8, 8, with_state=True, n_states=3)
    o_r, s_r = naive_recurrent_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu
    )
    o_c, s_c = naive_chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    assert rel_err(o_c, o_r) <= 1e-10 and rel_err(s_c, s_r) <= 1e-10


def test_qk_l2norm_in_kernel_equals_normalising_first():
    q, k, v, g, beta, _ = make_gdn_inputs(1, 70, 2, 2, 8, 8)
    k = k * 3.0
    o1, _ = naive_chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    nq = q / (q.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    nk = k / (k.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    o2, _ = naive_recurrent_gated_delta_rule(nq, nk, v, g, beta)
    assert rel_err(o1, o2) <= 1e-10


def test_low_precision_inputs_compute_in_float32():
    q, k, v, g, beta, _ = make_gdn_inputs(1, 100, 2, 4, 16, 16)
    ref, _ = naive_recurrent_gated_delta_rule(q, k, v, g, beta)
    lo = [x.to(torch.bfloat16) for x in (q, k, v, g, beta)]
    o, s = naive_chunk_gated_delta_rule(*lo, output_final_state=True)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    assert rel_err(o, ref) < 2e-2


def _bad(**overrides):
    q, k, v, g, beta, _ = make_gdn_inputs(1, 8, 2, 4, 4, 4)
    args = dict(q=q, k=k, v=v, g=g, beta=beta)
    args.update(overrides)
    return args


BAD_INPUTS = {
    "mismatched-qk-heads": (lambda: _bad(k=torch.randn(1, 8, 3, 4, dtype=torch.float64)), "same shape"),
    "hv-not-multiple": (
        lambda: _bad(
            v=torch.randn(1, 8, 3, 4, dtype=torch.float64),
            g=torch.randn(1, 8, 3, dtype=torch.float64),
            beta=torch.rand(1, 8, 3, dtype=torch.float64),
        ),
        "multiple",
    ),
    "integer-g": (lambda: _bad(g=torch.zeros(1, 8, 4, dtype=torch.long)), "g must be a floating-point"),
    "g-wrong-shape": (lambda: _bad(g=torch.zeros(1, 8, 2, dtype=torch.float64)), "g must be"),
    "v-wrong-length": (lambda: _bad(v=torch.randn(1, 7, 4, 4, dtype=torch.float64)), "v must be"),
    "q-3d": (lambda: _bad(q=torch.randn(8, 2, 4, dtype=torch.float64)), "q must be 4-D"),
    "cu_seqlens-with-B2": (
        lambda: dict(zip("qkvgb", make_gdn_inputs(2, 8, 2, 4, 4, 4)[:5]), cu_seqlens=torch.tensor([0, 8])),
        "batch size 1",
    ),
    "cu_seqlens-wrong-end": (lambda: _bad(cu_seqlens=torch.tensor([0, 3, 7])), "end at T=8"),
    "cu_seqlens-decreasing": (lambda: _bad(cu_seqlens=torch.tensor([0, 5, 3, 8])), "non-decreasing"),
    "cu_seqlens-float": (lambda: _bad(cu_seqlens=torch.tensor([0.0, 8.0])), "integer"),
    "initial-state-shape": (lambda: _bad(initial_state=torch.zeros(1, 2, 4, 4, dtype=torch.float64)), "initial_state"),
    "initial-state-count-varlen": (
        lambda: _bad(cu_seqlens=torch.tensor([0, 3, 8]), initial_state=torch.zeros(1, 4, 4, 4, dtype=torch.float64)),
        r"\[2, 4, 4, 4\]",
    ),
    "bad-scale": (lambda: _bad(scale=-1.0), "scale"),
    "meta-device": (lambda: _bad(v=torch.randn(1, 8, 4, 4, device="meta")), "one device"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
@pytest.mark.parametrize(
    "fn", [naive_recurrent_gated_delta_rule, naive_chunk_gated_delta_rule], ids=["recurrent", "chunk"]
)
def test_bad_inputs_raise_clear_errors(fn, name):
    make, pattern = BAD_INPUTS[name]
    args = make()
    if "b" in args:  # built from a positional tuple
        args["beta"] = args.pop("b")
    with pytest.raises(ValueError, match=pattern):
        fn(**args)
