"""A third-party client: lm-evaluation-harness's ``local-completions`` model runs a small generation task, read from
a local JSON file, against the live server (nothing downloaded), and scores exactly the greedy answers the server
gives through the ``openai`` client."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

DOCS = [
    {"question": "Q: What is the capital of France?\nA:", "answer": "Paris"},
    {"question": "Q: What color is the sky on a clear day?\nA:", "answer": "Blue"},
    {"question": "Q: How many legs does a spider have?\nA:", "answer": "Eight"},
    {"question": "Q: What is the opposite of hot?\nA:", "answer": "Cold"},
]
TASK = """\
task: longsparse_short_answers
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: " {{{{answer}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 6
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
"""


def test_lm_eval_local_completions_scores_the_servers_greedy_answers(smollm2_server, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    openai = pytest.importorskip("openai")
    from lm_eval import simple_evaluate
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    live = smollm2_server
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "short_answers.yaml").write_text(TASK.format(data=data))

    results = simple_evaluate(
        model="local-completions",
        model_args={
            "base_url": f"{live.url}/v1/completions",
            "model": live.name,
            "tokenizer_backend": None,
            "num_concurrent": 2,
            "max_retries": 1,
        },
        tasks=["longsparse_short_answers"],
        task_manager=TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False),
        log_samples=True,
    )
    samples = results["samples"]["longsparse_short_answers"]
    assert len(samples) == len(DOCS)

    c = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
    answers = {}
    for doc in DOCS:
        out = c.completions.create(
            model=live.name, prompt=doc["question"], max_tokens=6, temperature=0, stop=["\n", "."]
        )
        answers[doc["question"]] = out.choices[0].text
    for sample in samples:
        assert sample["resps"][0][0] == answers[sample["doc"]["question"]]
    want = exact_match_hf_evaluate(
        [answers[d["question"]] for d in DOCS], [" " + d["answer"] for d in DOCS], ignore_case=True
    )["exact_match"]
    assert results["results"]["longsparse_short_answers"]["exact_match,none"] == pytest.approx(want)
