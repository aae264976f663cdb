"""`bench tensor-parallel` pieces on the CPU: every size builds the same random model (each rank its part), and a
speedup is reported only where the logits agree with one GPU's. (The whole suite — ranks spawned over gloo at the
tiny geometry — is run by hand: ``longsparse bench --out /tmp/tp tensor-parallel --geometry tiny-qwen3.5 --lengths
130,300 --context 100 --batches 2,3 --steps 3 --reps 2 --tensor-parallel-size 2``.)"""

import torch

from longsparse.bench.geometry import GEOMETRIES
from longsparse.bench.tensor_parallel import CHECK_TOL, _compare, random_model, summarise
from longsparse.distributed import TensorParallel
from longsparse.models.parallel import parameter_shards


def test_every_size_holds_the_same_random_model():
    geometry = GEOMETRIES["tiny-qwen3.5"]
    whole = random_model(geometry, TensorParallel(), torch.float32, torch.device("cpu"), seed=3)
    again = random_model(geometry, TensorParallel(), torch.float32, torch.device("cpu"), seed=3)
    other = random_model(geometry, TensorParallel(), torch.float32, torch.device("cpu"), seed=4)
    half = random_model(geometry, TensorParallel(1, 2, object()), torch.float32, torch.device("cpu"), seed=3)
    shards = parameter_shards(half)
    params = dict(whole.named_parameters())
    for name, param in half.named_parameters():
        expected = shards[name].read(params[name]) if name in shards else params[name]
        assert torch.equal(param, expected), name
        assert torch.equal(params[name], dict(again.named_parameters())[name])
    norm = params["model.layers.0.input_layernorm.weight"]
    assert 0 < norm.std() < 0.2 and norm.abs().mean() < 0.3  # zero-centred: w − 1 around 0
    assert not torch.equal(params["lm_head.weight"], dict(other.named_parameters())["lm_head.weight"])


def test_speedups_are_reported_only_where_the_logits_agree():
    logits = torch.randn(101)
    base = {
        "rows": [
            dict(phase="prefill", T=131072, B=1, tp=1, ms=100.0),
            dict(phase="decode", T=32768, B=16, tp=1, ms_per_step=10.0),
        ],
        "logits": {("prefill", 131072): logits, ("decode", 16): logits},
    }
    split = {
        "rows": [
            dict(phase="prefill", T=131072, B=1, tp=2, ms=50.0),
            dict(phase="decode", T=32768, B=16, tp=2, ms_per_step=8.0),
        ],
        "logits": {("prefill", 131072): logits * (1 + CHECK_TOL / 2), ("decode", 16): logits + 1},
    }
    rows = _compare({1: base, 2: split})
    assert rows[2]["checked"] and rows[2]["speedup_vs_tp1"] == 2.0
    assert not rows[3]["checked"] and "speedup_vs_tp1" not in rows[3]
    assert summarise(rows) == {"prefill_speedup_tp2_128k": 2.0}
