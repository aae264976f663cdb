"""MiniCPM4: its three scalings and LongRoPE.

MiniCPM's embedding scale, residual-branch scale and logit divisor can be folded into a plain Llama's weights
(embeddings × scale_emb, o_proj and down_proj × scale_depth / sqrt(layers), LM head ÷ (hidden / dim_model_base)), since
RMSNorm sees the same direction either way. So a MiniCPM checkpoint must give the logits of transformers'
``LlamaForCausalLM`` holding those rescaled weights. LongRoPE is also checked against a direct evaluation of its
formula.
"""

import copy
import json
import math

import pytest
import torch
from safetensors.torch import save_file

from longsparse.engine import ModelRunner
from longsparse.models import RopeConfig, load_model
from longsparse.models.layers import RotaryEmbedding
from tests.helpers import rel_err
from tests.tiny_models import TINY, build, random_ids, reference_logits

SCALE_EMB, SCALE_DEPTH, DIM_MODEL_BASE = 12.0, 1.4, 16
SHORT = [1.0 + 0.15 * i for i in range(TINY["head_dim"] // 2)]
LONG = [1.5 + 0.6 * i for i in range(TINY["head_dim"] // 2)]


LONGROPE = {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_position_embeddings": 64}


# case -> (tie_word_embeddings, rope_scaling or None, max_position_embeddings, tokens)
CASES = {
    "untied-plain-rope": (False, None, 256, 37),
    "tied-plain-rope": (True, None, 256, 37),
    "longrope-short-factors": (False, LONGROPE, 64, 37),
    "longrope-long-factors": (False, LONGROPE, 256, 70),
}


def write_minicpm(path, llama, tied: bool, rope_scaling, max_pos: int):
    """A MiniCPM checkpoint (remote-code config keys) holding ``llama``'s weights."""
    config = {
        "architectures": ["MiniCPMForCausalLM"],
        "model_type": "minicpm",
        "hidden_act": "silu",
        "max_position_embeddings": max_pos,
        "rope_theta": 10000.0,
        "rope_scaling": rope_scaling,
        "scale_emb": SCALE_EMB,
        "scale_depth": SCALE_DEPTH,
        "dim_model_base": DIM_MODEL_BASE,
        "tie_word_embeddings": tied,
        **{k: TINY[k] for k in TINY if k not in ("head_dim", "max_position_embeddings")},
    }
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    weights = {k: v.contiguous() for k, v in llama.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(weights, str(path / "model.safetensors"))
    return path


def folded_llama(llama, tied: bool):
    """transformers' Llama with MiniCPM's scalings folded into its weights."""
    ref = copy.deepcopy(llama)
    layers = ref.config.num_hidden_layers
    with torch.no_grad():
        embed = llama.model.embed_tokens.weight
        head = embed if tied else llama.lm_head.weight
        ref.lm_head.weight = torch.nn.Parameter(head / (ref.config.hidden_size / DIM_MODEL_BASE))
        ref.model.embed_tokens.weight.mul_(SCALE_EMB)
        for layer in ref.model.layers:
            layer.self_attn.o_proj.weight.mul_(SCALE_DEPTH / math.sqrt(layers))
            layer.mlp.down_proj.weight.mul_(SCALE_DEPTH / math.sqrt(layers))
    return ref


@pytest.mark.parametrize("case", CASES)
def test_minicpm_equals_llama_with_folded_scalings(tmp_path, case):
    tied, rope_scaling, max_pos, tokens = CASES[case]
    settings = dict(max_position_embeddings=max_pos)
    if rope_scaling is not None:
        settings["rope_parameters"] = {**rope_scaling, "rope_theta": 10000.0}
    llama = build("llama-gqa-bias", seed=5, attention_bias=False, mlp_bias=False, **settings)
    ours = load_model(write_minicpm(tmp_path / "minicpm", llama, tied, rope_scaling, max_pos))
    ids = random_ids(tokens, seed=6)
    ref = reference_logits(folded_llama(llama, tied), ids)
    out = ModelRunner(ours.model).prefill([ids], all_logits=True).logits
    assert rel_err(out, ref) <= 1e-4
    # the scalings matter: the unscaled Llama is far off
    assert rel_err(out, reference_logits(llama, ids)) > 0.05


@pytest.mark.parametrize("max_pos", [64, 1000], ids=["short-factors", "long-factors"])
def test_longrope_tables_match_the_formula(max_pos):
    """cos/sin of MiniCPM's LongRoPE written out directly: angle = p / (factor_i · θ^(2i/d)), both scaled by
    sqrt(1 + ln(max / original) / ln(original)) when max > original (long factors), else unscaled short factors."""
    original, dim, theta = 64, 16, 10000.0
    rope = RopeConfig.from_hf(
        {"rope_theta": theta, "rope_scaling": LONGROPE}, head_dim=dim, max_position_embeddings=max_pos
    )
    positions = torch.tensor([0, 1, 5, 63, 64, 500, 999])
    cos, sin = RotaryEmbedding(rope)(positions)
    long = max_pos > original
    factors = LONG if long else SHORT
    scale = math.sqrt(1 + math.log(max_pos / original) / math.log(original)) if long else 1.0
    for row, p in enumerate(positions.tolist()):
        for i in range(dim // 2):
            angle = p / (factors[i] * theta ** (2 * i / dim))
            for col in (i, i + dim // 2):
                assert cos[row, col].item() == pytest.approx(scale * math.cos(angle), abs=1e-6)
                assert sin[row, col].item() == pytest.approx(scale * math.sin(angle), abs=1e-6)


def test_minicpm_scalings_read_from_config(tmp_path):
    llama = build("llama-gqa-bias", seed=7, attention_bias=False, mlp_bias=False)
    config = load_model(write_minicpm(tmp_path / "m", llama, False, None, 256)).config
    assert config.embedding_scale == SCALE_EMB
    assert config.residual_scale == pytest.approx(SCALE_DEPTH / math.sqrt(TINY["num_hidden_layers"]))
    assert config.logit_divisor == TINY["hidden_size"] / DIM_MODEL_BASE
