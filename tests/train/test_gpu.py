"""Forecast training on CUDA: a bfloat16 backbone with bf16 autocast gives the float32 CPU loss within bf16 drift, and
only the float32 projections learn; a SmolLM2-geometry step at 8K tokens fits and runs."""

import copy

import pytest
import torch

from longsparse.tasks.streams import TokenStream
from longsparse.train.forecast import ForecastTrainingConfig, new_projections, sequence_loss, train_forecast
from longsparse.train.objective import supervised_positions
from tests.train.tiny import SMALL, VOCAB, tiny_llama

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("teacher", ["fine", "coarse"])
def test_bf16_autocast_loss_matches_float32(teacher):
    config = ForecastTrainingConfig(seq_len=803, positions=96, sparse=SMALL, teacher=teacher, init="random")
    model = tiny_llama(seed=11)
    ids = torch.randint(0, VOCAB, (803,), generator=torch.Generator().manual_seed(0))
    positions = supervised_positions(803, SMALL, config.k)[::5]
    ref_proj = new_projections(model, config, "tiny", "r")
    ref, _, _ = sequence_loss(model, ref_proj, ids, positions, config)
    gpu_model = copy.deepcopy(model).to("cuda", torch.bfloat16)
    proj = copy.deepcopy(ref_proj).to("cuda")
    loss, _, _ = sequence_loss(gpu_model, proj, ids, positions, config)
    loss.backward()
    assert abs(loss.item() - ref.item()) <= 0.05 * ref.item()
    assert all(p.grad is None for p in gpu_model.parameters())
    assert all(p.dtype == torch.float32 and p.grad.abs().sum() > 0 for p in proj.parameters())


def test_smollm2_geometry_step_at_8k_tokens():
    """A 30-layer model of SmolLM2's attention geometry (9 Q / 3 KV heads of 64, hidden 576) and the default selection
    geometry: two optimizer steps on 8K-token sequences with 512 positions each."""
    from longsparse.models.config import DecoderConfig, RopeConfig
    from longsparse.models.llama import LlamaForCausalLM
    from tests.tiny_models import randomize

    cfg = DecoderConfig(
        architecture="LlamaForCausalLM",
        model_type="llama",
        vocab_size=1000,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope=RopeConfig(head_dim=64, rotary_dim=64, theta=100000.0),
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    model = randomize(LlamaForCausalLM(cfg), 0).to("cuda", torch.bfloat16).requires_grad_(False).eval()
    stream = TokenStream("random", torch.randint(0, 1000, (20000,), generator=torch.Generator().manual_seed(1)))
    config = ForecastTrainingConfig(seq_len=8192, steps=2, positions=512)
    result = train_forecast(model, stream, config, base_model="random", progress=False)
    assert len(result.history) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in result.history)
