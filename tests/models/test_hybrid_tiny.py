"""The committed trained hybrid (models/hybrid-tiny, docs/hybrid.md) still retrieves through the library: a guard on
the weights and on the Qwen3.5 path that loads and runs them, with dense GDN and with SparseGDN's selection."""

import json
from pathlib import Path

import pytest

from longsparse import LLM
from longsparse.eval.ruler import RulerGenerator
from longsparse.eval.scoring import score

MODEL = Path(__file__).resolve().parents[2] / "models" / "hybrid-tiny"


def test_the_model_has_qwen35s_gdn_geometry():
    """SparseGDN's 16 head pairs and tier table apply only at 16 q/k heads and 32 v heads of 128."""
    config = json.loads((MODEL / "config.json").read_text())
    geometry = [config[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                    "linear_value_head_dim")]  # fmt: skip
    assert geometry == [16, 32, 128, 128] and config["layer_types"].count("full_attention") == 2


@pytest.mark.parametrize("gdn", ["dense", "sparse"])
def test_it_answers_needles_at_2k_tokens(gdn):
    """The greedy answer to a multi-key RULER sample at 2K tokens (seed 42, the evaluation's; distractor needles
    with other keys) is the needle's value; the sparse run really skipped recurrence events (keep ratio below 1)."""
    llm = LLM(MODEL, gdn=gdn, device="cpu")
    sample = RulerGenerator(llm.tokenizer, seed=42).sample("niah_multikey_1", 2048, 0)
    (out,) = llm.generate(sample.prompt, max_new_tokens=sample.max_new_tokens)
    assert score(sample.task, out.text, sample.references) == 1.0, (sample.references, out.text)
    keep = llm.last_stats.keep_ratio
    assert (keep is None) if gdn == "dense" else (0 < keep < 1)
