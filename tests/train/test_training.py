"""The training loop on tiny models: only Forecast parameters learn, resuming equals an uninterrupted run, the loss
goes down, bad configs are refused."""

import pytest
import torch

from longsparse.tasks.streams import TokenStream
from longsparse.train.forecast import (
    ForecastTrainingConfig,
    new_projections,
    sequence_loss,
    train_forecast,
)
from longsparse.train.objective import supervised_positions
from tests.train.tiny import SMALL, VOCAB, tiny_hybrid, tiny_llama

SEQ = 203


def _stream(n=3000, seed=0):
    return TokenStream("random", torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)))


def _config(**changes):
    settings = dict(seq_len=SEQ, steps=4, positions=24, checkpoint_every=2, sparse=SMALL, seed=7) | changes
    return ForecastTrainingConfig(**settings)


@pytest.mark.parametrize("build", [tiny_llama, tiny_hybrid], ids=["llama", "hybrid"])
@pytest.mark.parametrize("teacher", ["fine", "coarse"])
def test_only_forecast_parameters_get_gradients(build, teacher):
    # left trainable on purpose: the loss graph itself must not reach the backbone (train_forecast also freezes it)
    model = build(seed=1).requires_grad_(True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = _config(teacher=teacher, init="random")
    projections = new_projections(model, config, "tiny", "random")
    ids = _stream().tokens[:SEQ]
    positions = supervised_positions(SEQ, SMALL, config.k)[::3]
    loss, per_layer, recall = sequence_loss(model, projections, ids, positions, config)
    loss.backward()
    assert loss.requires_grad and sorted(per_layer) == list(model.config.attention_layers) and 0 < recall <= 1
    assert all(p.grad is None for p in model.parameters())
    for name, p in projections.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def _weights(result):
    return {k: v.clone() for k, v in result.projections.state_dict().items()}


def test_resuming_reproduces_the_uninterrupted_run(tmp_path):
    model, stream = tiny_llama(seed=2), _stream()
    whole = train_forecast(model, stream, _config(), base_model="tiny", checkpoint=tmp_path / "a.pt", progress=False)
    first = train_forecast(
        model, stream, _config(steps=2), base_model="tiny", checkpoint=tmp_path / "b.pt", progress=False
    )
    assert [r["step"] for r in first.history] == [1, 2]
    rest = train_forecast(
        model, stream, _config(), base_model="tiny", checkpoint=tmp_path / "b.pt", resume=True, progress=False
    )
    assert [r["step"] for r in rest.history] == [1, 2, 3, 4]
    for name, w in _weights(whole).items():
        assert torch.equal(_weights(rest)[name], w), name
    assert [r["loss"] for r in rest.history] == [r["loss"] for r in whole.history]
    # a different run cannot continue this checkpoint
    with pytest.raises(ValueError, match="belongs to another run"):
        train_forecast(
            model,
            stream,
            _config(lr=1e-3),
            base_model="tiny",
            checkpoint=tmp_path / "b.pt",
            resume=True,
            progress=False,
        )


def test_training_lowers_the_loss_on_held_out_positions():
    model, stream = tiny_llama(seed=3), _stream()
    config = _config(steps=25, positions=32, lr=1e-2, init="random")
    held_out = _stream(seed=9).tokens[:SEQ]
    positions = supervised_positions(SEQ, SMALL, config.k)

    def loss_of(projections):
        return sequence_loss(model, projections, held_out, positions, config)[0].item()

    start = loss_of(new_projections(model, config, "tiny", "random"))
    logged = []
    result = train_forecast(model, stream, config, base_model="tiny", log=logged.append, progress=False)
    assert len(logged) == 25 and set(logged[0]) >= {"step", "loss", "recall", "grad_norm", "layer_kl"}
    assert loss_of(result.projections) < 0.7 * start


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(teacher="medium"), "teacher must be one of fine, coarse"),
        (dict(init="zeros"), "init must be one of query, random"),
        (dict(seq_len=60), "no query position with more than k=4 candidates"),
        (dict(fine_grid=(16, 2)), "must tile the student grid"),
        (dict(betas=(0.9, 1.0)), "betas must be two numbers in"),
        (dict(lr=0.0), "need lr > 0"),
        (dict(positions=0), "positions must be a positive int"),
        (dict(partition_k=0), "partition_k must be a positive int or None"),
    ],
    ids=["teacher", "init", "too-short", "fine-grid", "betas", "lr", "positions", "partition-k"],
)
def test_config_validation(changes, message):
    with pytest.raises(ValueError, match=message):
        _config(**changes)


def test_config_round_trips_through_its_dict():
    config = _config(teacher="coarse", betas=(0.8, 0.9))
    assert ForecastTrainingConfig(**config.to_dict()) == config
    assert config.same_run(_config(teacher="coarse", betas=(0.8, 0.9), steps=99, checkpoint_every=5))
    assert not config.same_run(_config(betas=(0.8, 0.9)))
