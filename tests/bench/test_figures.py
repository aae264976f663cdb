"""README's and BENCHMARKS.md's figures are rendered from benchmarks/results/*.json (`longsparse.bench.figures`): the
repository's documents agree with its JSON, and a hand edit or a new result is caught."""

import json

import pytest

from longsparse.bench import figures


def test_readme_and_benchmarks_agree_with_the_results_json():
    """Fails when a figure was edited by hand or a results file changed without `python -m longsparse.bench.figures`."""
    assert figures.sync(check=True) == []


def _results(path, flashqla_128k=0.95, checked_128k=True):
    path.mkdir(parents=True)
    env = {"device": "NVIDIA H200", "date": "2030-01-02T03:04:05+00:00", "git_commit": "abc1234"}
    gdn_rows = [
        {"B": 1, "T": 4096, "ours_ms": 0.2, "passed": True},
        {"B": 1, "T": 131072, "ours_ms": 2.5, **({"passed": True} if checked_128k else {})},
        {"B": 2, "T": 32768, "ours_ms": 1.3},
    ]
    gdn = {"speedup_vs_fla_128k": 3.0, "speedup_vs_flashqla_128k": flashqla_128k, "speedup_vs_best_dense_128k": 0.95,
           "best_dense_128k": "flashqla", "flashinfer_unavailable": "import flashinfer.gdn_prefill failed: X",
           "mem_ratio_vs_fla_128k": 0.31, "speedup_vs_fla_4k": 1.2}  # fmt: skip
    model = {"decode_speedup_vs_hf_b16_32k_qwen35_4b": 7.2, "decode_speedup_vs_hf_best_b16_32k_qwen35_4b": 2.4,
             "decode_hf_best_b16_32k_qwen35_4b": "hf_compiled", "prefill_speedup_vs_hf_128k_qwen35_4b": 1.1,
             "prefill_speedup_vs_hf_best_128k_qwen35_4b": 1.1}  # fmt: skip
    attn = {"select_speedup_prefill_128k": 4.1, "select_speedup_decode_128k": 1.3}
    for name, summary, rows in (("gdn_core", gdn, gdn_rows), ("model", model, []), ("sparse_attn", attn, [])):
        (path / f"{name}.json").write_text(json.dumps({"environment": env, "summary": summary, "rows": rows}))


def _documents(root):
    (root / "benchmarks").mkdir(parents=True)
    blocks = {doc: "\n\n".join(f"<!-- figures:{b}:begin -->\nold\n<!-- figures:{b}:end -->" for b in names)
              for doc, names in figures.DOCUMENTS.items()}  # fmt: skip
    for doc, text in blocks.items():
        (root / doc).parent.mkdir(parents=True, exist_ok=True)
        (root / doc).write_text(f"# {doc}\n\nprose kept as it is\n\n{text}\n\nmore prose\n")


def test_blocks_are_rewritten_from_the_json_and_a_stale_one_is_named(tmp_path):
    results, root = tmp_path / "results", tmp_path / "repo"
    _results(results)
    _documents(root)
    assert sorted(figures.sync(root, results, check=True)) == sorted(
        f"{doc}:{b}" for doc, names in figures.DOCUMENTS.items() for b in names
    )
    figures.sync(root, results)
    assert figures.sync(root, results, check=True) == []
    readme = (root / "README.md").read_text()
    assert readme.startswith("# README.md\n\nprose kept as it is") and readme.rstrip().endswith("more prose")
    assert "3.00× FLA, 0.95× FlashQLA, FlashInfer not measured" in readme.replace("\n  ", " ")
    assert "2.40× transformers' fastest decode (`hf_compiled`)" in readme.replace("\n  ", " ")
    table = (root / "benchmarks" / "BENCHMARKS.md").read_text()
    assert "| `speedup_vs_fla_4k` | FLA (Triton) / ours, 4K | 1.20 | ≥ 1.5 | missed |" in table
    assert "| `speedup_vs_fla_128k` | FLA (Triton) / ours, 128K | 3.00 | ≥ 2 | met |" in table
    assert "`flashinfer_unavailable`: import flashinfer.gdn_prefill failed: X" in table
    assert "not checked: 2 × 32K" in table

    _results(tmp_path / "new", flashqla_128k=1.4)  # a new run: the documents are stale until re-rendered
    assert figures.sync(root, tmp_path / "new", check=True) == ["README.md:where-it-stands",
                                                                "benchmarks/BENCHMARKS.md:gdn_core"]  # fmt: skip
    (root / "README.md").write_text(readme.replace("3.00× FLA", "3.10× FLA"))  # a figure edited by hand
    assert figures.sync(root, results, check=True) == ["README.md:where-it-stands"]


def test_a_figure_from_an_unchecked_row_is_not_claimed(tmp_path):
    _results(tmp_path / "results", checked_128k=False)
    table = figures.headline_table("gdn_core", figures.load("gdn_core", tmp_path / "results"))
    assert "| 3.00 | ≥ 2 | not checked at that length |" in table
    assert (
        "| `speedup_vs_flashinfer_32k` | FlashInfer (CuTe DSL) / ours, 32K | not measured | — | not measured |" in table
    )


def test_markers_must_be_there_once_each():
    with pytest.raises(ValueError, match="figures block 'model'"):
        figures.replace_block("no markers", "model", "x")
    twice = "<!-- figures:model:begin -->\n<!-- figures:model:end -->\n" * 2
    with pytest.raises(ValueError, match="figures block 'model'"):
        figures.replace_block(twice, "model", "x")
    once = "a\n<!-- figures:model:begin -->\nold\n<!-- figures:model:end -->\nb"
    assert (
        figures.replace_block(once, "model", "new")
        == "a\n<!-- figures:model:begin -->\nnew\n<!-- figures:model:end -->\nb"
    )


def test_recall_ranking_orders_rules_by_their_share_of_the_oracle():
    def entry(recall, of_oracle, top=1.0):
        at = {"recall": recall, "of_oracle": of_oracle, "top_block_hit": top}
        return {n: at for n in ("4096", "8192", "all")}

    data = {
        "environment": {"device": "cpu", "date": "2030-01-02T03:04:05+00:00", "git_commit": "abc1234"},
        "config": {"samples": 8, "question_rows": 32, "answer_tokens": 12},
        "summary": {
            "sparse.current": {"question": entry(0.6, 0.75), "answer": entry(0.5, 0.625, 0.9)},
            "oracle": {"question": entry(0.8, 1.0), "answer": entry(0.8, 1.0)},
            "sparse.cmp8": {"question": entry(0.7, 0.875), "answer": entry(0.6, 0.75, 0.95)},
        },
    }
    table = figures.recall_ranking(data).splitlines()
    rows = [line for line in table if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == ["oracle", "sparse.cmp8", "sparse.current"]
    assert rows[2] == "| `sparse.current` | 0.600 | 0.600 | 0.500 | 0.500 | 0.688 | 0.900 |"
    assert "8 RULER samples" in table[0]
    assert figures.recall_ranking(None) == "No `results/selection_recall.json` yet."
