"""Running a model over samples (fake models that read the prompt), and the run's table, JSON and plot."""

import json

import pytest

from longsparse.eval.report import RulerRun, format_scores, length_label, load_run, plot_scores
from longsparse.eval.runner import Model, evaluate
from longsparse.tasks.ruler import MISSING_TASKS, RulerGenerator
from longsparse.tasks.tokens import parse_length

from .fakes import HalfModel, OracleModel, RegexTokenizer, WrongModel

TASKS_SMALL = ("niah_single_1", "niah_multiquery", "vt", "cwe", "fwe")


@pytest.fixture(scope="module")
def samples():
    gen = RulerGenerator(RegexTokenizer(), seed=3)
    return [s for k in (1024, 2048) for t in TASKS_SMALL for s in gen.samples(t, k, 3)]


def test_fakes_have_the_model_surface():
    assert isinstance(OracleModel(), Model)


def test_oracle_scores_everything_and_batches_by_generation_budget(samples):
    model = OracleModel()
    results = evaluate(model, samples, batch_size=2, progress=False)
    assert [r.id for r in results] == [s.id for s in samples]
    assert all(r.score == 1.0 for r in results)
    assert all(temp == 0.0 and stop == [] for _, _, temp, stop in model.calls)  # greedy, no stop strings
    budgets = {"niah_single_1": 128, "niah_multiquery": 128, "vt": 30, "cwe": 120, "fwe": 50}
    expected_calls = []
    for _length in (1024, 2048):
        run = [budgets[t] for t in TASKS_SMALL for _ in range(3)]
        i = 0
        while i < len(run):  # consecutive samples with one budget, two at a time
            j = i + 1 if i + 1 < len(run) and run[i + 1] == run[i] else i
            expected_calls.append((j - i + 1, run[i]))
            i = j + 1
    assert [(n, m) for n, m, _, _ in model.calls] == expected_calls


def test_wrong_and_half_models_score_lower(samples):
    wrong = evaluate(WrongModel(), samples, progress=False)
    half = evaluate(HalfModel(), samples, progress=False)
    assert all(r.score == 0.0 for r in wrong)
    assert 0 < sum(r.score for r in half) < len(samples)


def test_model_returning_too_few_outputs_is_an_error(samples):
    class Short(OracleModel):
        def generate(self, prompts, **kw):
            return super().generate(prompts, **kw)[:-1]

    with pytest.raises(ValueError, match="outputs"):
        evaluate(Short(), samples[:2], batch_size=2, progress=False)


def _record(task, length, i, score):
    return {"id": f"{task}/{length}/{i}", "task": task, "target_length": length, "score": score}


def test_summary_averages_tasks_then_lengths_like_ruler():
    recs = [_record("a", 4096, i, s) for i, s in enumerate([1, 1, 0, 0])]  # 50
    recs += [_record("b", 4096, i, s) for i, s in enumerate([1, 1, 1, 0.5])]  # 87.5
    recs += [_record("a", 8192, i, s) for i, s in enumerate([0, 0, 0, 0])]  # 0
    recs += [_record("b", 8192, i, s) for i, s in enumerate([1, 0, 0, 0])]  # 25
    run = RulerRun("r", {}, recs, dict(MISSING_TASKS), environment={})
    assert run.scores() == {"a": {4096: 50.0, 8192: 0.0}, "b": {4096: 87.5, 8192: 25.0}}
    s = run.summary()
    assert s["per_length"] == {"4096": 68.75, "8192": 12.5}
    assert s["score"] == pytest.approx(40.625)
    assert s["missing_tasks"] == ["qa_1", "qa_2"] and s["num_samples"] == 16
    table = format_scores(run).splitlines()
    assert table[0].split() == ["task", "4K", "8K", "mean"]
    assert table[2].split() == ["a", "50.000", "0.000", "25.000"]
    assert table[4].split() == ["average", "68.750", "12.500", "40.625"]
    assert any(line.startswith("qa_1: missing") for line in table)


def test_run_round_trips_through_json_and_plots(tmp_path, samples):
    results = evaluate(HalfModel(), samples, progress=False)
    run = RulerRun.from_results("half", {"seed": 3}, results, MISSING_TASKS)
    path = run.save(tmp_path / "results" / "half.json")
    data = json.loads(path.read_text())
    assert data["summary"]["score"] == pytest.approx(run.summary()["score"])
    assert set(data["samples"][0]) >= {"id", "prediction", "score", "references", "prompt_sha1", "depths", "length"}
    assert data["missing_tasks"] == MISSING_TASKS
    again = load_run(path)
    assert again.scores() == run.scores() and again.config == {"seed": 3}
    pytest.importorskip("matplotlib")
    png = plot_scores(tmp_path / "half.png", {"half": run, "other": again})
    assert png.stat().st_size > 1000


def test_load_run_rejects_other_results(tmp_path):
    p = tmp_path / "bench.json"
    p.write_text(json.dumps({"summary": {}, "rows": []}))
    with pytest.raises(ValueError, match="not a RULER run"):
        load_run(p)


@pytest.mark.parametrize("text, tokens", [("4k", 4096), ("128K", 131072), ("3000", 3000), (" 8k ", 8192)])
def test_lengths_parse_and_print(text, tokens):
    assert parse_length(text) == tokens
    assert length_label(4096) == "4K" and length_label(3000) == "3000"


@pytest.mark.parametrize("text", ["4m", "k", "-1", "0"])
def test_bad_lengths(text):
    with pytest.raises(ValueError, match="length"):
        parse_length(text)


def test_keep_ratio_of_each_generate_call_is_recorded_and_averaged(samples):
    class Sparse(OracleModel):
        """Reports a different keep ratio after each call, like ``LLM.last_stats``."""

        def generate(self, prompts, **kw):
            self.last_stats = type("Stats", (), {"keep_ratio": 0.1 * (len(self.calls) + 1)})()
            return super().generate(prompts, **kw)

    few = samples[:3]  # one budget: the calls hold 2 and 1 samples
    results = evaluate(Sparse(), few, batch_size=2, progress=False)
    assert [r.keep_ratio for r in results] == pytest.approx([0.1, 0.1, 0.2])
    run = RulerRun.from_results("s", {}, results, {})
    assert run.summary()["keep_ratio"] == pytest.approx(0.4 / 3)
    dense = RulerRun.from_results("d", {}, evaluate(OracleModel(), few, progress=False), {})
    assert all(r["keep_ratio"] is None for r in dense.samples) and dense.summary()["keep_ratio"] is None


def test_side_by_side_reports_scores_differences_and_keep_ratio():
    from longsparse.eval.quality import side_by_side

    def run(name, scores, keep):
        recs = [
            {**_record(t, k, i, s), "prompt_sha1": f"{t}{k}{i}", "keep_ratio": keep}
            for (t, k), per in scores.items()
            for i, s in enumerate(per)
        ]
        return RulerRun(name, {}, recs, {}, environment={})

    dense = run("dense", {("a", 4096): [1, 1, 1, 1], ("a", 8192): [1, 1, 0, 0]}, None)
    sparse = run("sparse", {("a", 4096): [1, 1, 1, 0], ("a", 8192): [1, 1, 0, 0]}, 0.25)
    random = run("random", {("a", 4096): [0, 0, 1, 0], ("a", 8192): [0, 0, 0, 0]}, 0.26)
    out = side_by_side({"dense": dense, "sparse": sparse, "random": random}, "dense", keep_ratio_of="sparse",
                       resamples=200)  # fmt: skip
    s = out["summary"]
    assert (s["dense_score"], s["sparse_score"], s["random_score"]) == (75.0, 62.5, 12.5)
    assert s["keep_ratio"] == 0.25 and s["random_keep_ratio"] == 0.26 and "dense_keep_ratio" not in s
    assert s["sparse_minus_dense"]["difference"] == pytest.approx(-12.5)
    assert s["random_minus_dense"]["low"] <= s["random_minus_dense"]["difference"] == pytest.approx(-62.5)
    assert out["per_length"]["8192"]["random_score"] == 0.0
    assert out["per_length"]["4096"]["sparse_minus_dense"]["difference"] == pytest.approx(-25.0)
    assert set(out["comparisons"]) == {"sparse_vs_dense", "random_vs_dense"}
    with pytest.raises(ValueError, match="baseline"):
        side_by_side({"dense": dense, "sparse": sparse}, "fast")


def test_common_samples_pairs_runs_of_different_sizes_and_refuses_other_prompts():
    from longsparse.eval.quality import common_samples

    def run(name, n, salt=""):
        recs = [{**_record("a", 4096, i, 1), "prompt_sha1": f"a{i}{salt}"} for i in range(n)]
        return RulerRun(name, {}, recs, {}, environment={})

    out = common_samples({"dense": run("dense", 10), "sparda": run("sparda", 3)})
    assert [len(r.samples) for r in out.values()] == [3, 3]
    assert {r["id"] for r in out["dense"].samples} == {r["id"] for r in out["sparda"].samples}
    with pytest.raises(ValueError, match="different prompts in runs 'dense' and 'other'"):
        common_samples({"dense": run("dense", 10), "other": run("other", 3, salt="x")})
