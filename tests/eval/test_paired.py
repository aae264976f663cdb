"""Paired bootstrap: exact on constructed cases, calibrated against the normal approximation, stratified."""

import numpy as np
import pytest

from longsparse.eval.paired import compare_records, paired_bootstrap


def test_identical_configurations_give_zero_and_a_zero_interval():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2, 300).astype(float)
    d = paired_bootstrap(a, a.copy(), [i % 3 for i in range(300)], resamples=2000)
    assert (d.difference, d.low, d.high) == (0.0, 0.0, 0.0)


def test_a_constant_shift_is_recovered_exactly():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2, 240) * 0.5  # scores 0 or 0.5
    b = a + 0.5
    d = paired_bootstrap(a, b, [("niah", i % 4) for i in range(240)], resamples=3000)
    assert (d.difference, d.low, d.high) == (50.0, 50.0, 50.0)
    assert d.b - d.a == pytest.approx(50.0)


def test_interval_matches_the_normal_approximation_for_a_large_sample():
    rng = np.random.default_rng(2)
    n = 4000
    a = np.zeros(n)
    b = (rng.random(n) < 0.3).astype(float)  # B is right on ~30% of samples, A never
    d = paired_bootstrap(a, b, resamples=20_000, seed=3)
    p = b.mean()
    half = 1.96 * np.sqrt(p * (1 - p) / n) * 100
    assert d.difference == pytest.approx(100 * p)
    assert d.low < d.difference < d.high
    assert (d.high - d.low) / 2 == pytest.approx(half, rel=0.05)


def test_stratification_weights_strata_equally_and_removes_between_stratum_variance():
    # Stratum x: 10 samples, B better by 1; stratum y: 30 samples, no difference. Aggregate = mean of strata.
    a = np.zeros(40)
    b = np.concatenate([np.ones(10), np.zeros(30)])
    strata = ["x"] * 10 + ["y"] * 30
    d = paired_bootstrap(a, b, strata, resamples=1000)
    assert d.difference == pytest.approx(50.0)  # (100 + 0) / 2, not 25 (the pooled mean)
    assert d.low == d.high == 50.0  # within each stratum the difference is constant: nothing to resample
    pooled = paired_bootstrap(a, b, resamples=1000)
    assert pooled.difference == pytest.approx(25.0) and pooled.high > pooled.low


def test_seeded_and_vectorised_over_large_strata():
    rng = np.random.default_rng(4)
    a, b = rng.random(1200), rng.random(1200)
    x = paired_bootstrap(a, b, resamples=20_000, seed=7)
    y = paired_bootstrap(a, b, resamples=20_000, seed=7)
    z = paired_bootstrap(a, b, resamples=20_000, seed=8)
    assert x == y and (x.low, x.high) != (z.low, z.high)
    assert abs(x.low - z.low) < 0.3 and x.resamples == 20_000


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(a=[1.0], b=[1.0, 0.0]), "1-D arrays"),
        (dict(a=[], b=[]), "non-empty"),
        (dict(a=[1.0], b=[0.0], strata=[1, 2]), "strata"),
        (dict(a=[1.0], b=[0.0], resamples=0), "resamples"),
        (dict(a=[1.0], b=[0.0], confidence=1.0), "confidence"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        paired_bootstrap(**kwargs)


def _records(scores, sha="s"):
    return [
        {"id": f"{t}/{k}/{i}", "task": t, "target_length": k, "prompt_sha1": f"{sha}{t}{k}{i}", "score": s}
        for (t, k, i), s in scores.items()
    ]


def test_compare_records_pairs_by_id_and_reports_per_length_and_task():
    keys = [(t, k, i) for t in ("vt", "cwe") for k in (1024, 2048) for i in range(5)]
    a = {key: 1.0 for key in keys}
    b = {key: (0.0 if key[1] == 2048 and key[0] == "vt" else 1.0) for key in keys}
    rb = _records(b)[::-1]  # order does not matter
    c = compare_records(_records(a), rb, resamples=500)
    assert c.overall.difference == pytest.approx(-25.0)
    assert c.per_length[1024].difference == 0.0
    assert c.per_length[2048].difference == pytest.approx(-50.0)
    assert c.per_task["vt"].difference == pytest.approx(-50.0) and c.per_task["cwe"].difference == 0.0
    assert set(c.as_dict()) == {"overall", "per_length", "per_task"}


def test_compare_records_refuses_different_samples():
    keys = [("vt", 1024, i) for i in range(3)]
    a = _records({k: 1.0 for k in keys})
    with pytest.raises(ValueError, match="different samples"):
        compare_records(a, a[:2])
    with pytest.raises(ValueError, match="different prompts"):
        compare_records(a, _records({k: 1.0 for k in keys}, sha="t"))
    with pytest.raises(ValueError, match="twice"):
        compare_records(a + a[:1], a)
