"""Layer-level properties: the GDN decode step is the gated delta rule's recurrence; prefill + steps equals one long
prefill; rotary tables; configuration validation."""

import pytest
import torch

from longsparse.engine import GDNStates
from longsparse.models import DecoderConfig, RopeConfig
from longsparse.models.batch import ForwardBatch
from longsparse.models.config import decoder_config_from_hf, hybrid_config_from_hf
from longsparse.models.layers import GatedDeltaNet, RotaryEmbedding
from longsparse.models.plan import StepStats
from longsparse.ops.gdn import naive_recurrent_gated_delta_rule
from tests.helpers import rel_err
from tests.tiny_models import TINY, TINY_GDN, randomize

H, HV, DK, DV, KERNEL, HIDDEN = 2, 6, 8, 12, 4, 32


def gdn_layer(seed=0) -> GatedDeltaNet:
    return randomize(GatedDeltaNet(0, HIDDEN, H, HV, DK, DV, KERNEL, 1e-6), seed).eval()


def states(slots: int) -> GDNStates:
    return GDNStates([0], slots, 2 * H * DK + HV * DV, KERNEL, HV, DK, DV, torch.float32, "cpu")


def test_decode_step_is_one_step_of_the_recurrent_reference():
    """Three sequences in slots 2, 0, 3 of 4 (slot 1 must stay untouched), random prior states, float64 reference."""
    gen = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    N, slots = 3, [2, 0, 3]
    q, k, v = r(N, H, DK), r(N, H, DK), r(N, HV, DV)
    g, beta = torch.nn.functional.logsigmoid(r(N, HV) + 2), torch.rand(N, HV, generator=gen)
    st = states(4)
    st.recurrent[0].copy_(r(4, HV, DK, DV) * 0.3)
    before = st.recurrent[0].clone()
    batch = ForwardBatch.decode([5, 9, 2], "cpu", slots=slots, kv_cache=None, gdn_states=st)
    o = gdn_layer()._recurrent_step(q, k, v, g, beta, batch)
    ref_o, ref_state = naive_recurrent_gated_delta_rule(
        *(x[:, None].double() for x in (q, k, v, g, beta)),
        initial_state=before[slots].double(),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    assert rel_err(o, ref_o[:, 0]) <= 1e-5
    assert rel_err(st.recurrent[0][slots], ref_state) <= 1e-5
    assert torch.equal(st.recurrent[0][1], before[1])


@pytest.mark.parametrize("prompt", [1, 3, 70], ids=["T1", "T3-shorter-than-conv", "T70"])
def test_prefill_then_decode_steps_equal_one_long_prefill(prompt):
    """Conv and recurrent states carry over: prefill + 5 single-token steps = a stateless prefill of all tokens."""
    layer, steps = gdn_layer(1), 5
    x = torch.randn(prompt + steps, HIDDEN, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = layer(x, ForwardBatch.prefill([prompt + steps], "cpu"))
        st = states(1)
        outs = [layer(x[:prompt], ForwardBatch.prefill([prompt], "cpu", gdn_states=st))]
        for t in range(prompt, prompt + steps):
            batch = ForwardBatch.decode([t], "cpu", slots=[0], kv_cache=None, gdn_states=st)
            outs.append(layer(x[t : t + 1], batch))
    assert rel_err(torch.cat(outs), ref) <= 1e-5


def test_packed_prefill_equals_separate_prefills():
    """Sequences packed with cu_seqlens neither see each other's conv inputs nor recurrent state."""
    layer = gdn_layer(3)
    lens = [5, 67, 2]
    xs = [torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(i)) for i, n in enumerate(lens)]
    with torch.no_grad():
        packed = layer(torch.cat(xs), ForwardBatch.prefill(lens, "cpu"))
        alone = torch.cat([layer(x, ForwardBatch.prefill([len(x)], "cpu")) for x in xs])
    assert rel_err(packed, alone) <= 1e-6


def test_keep_ratios_are_read_once_in_layer_order():
    """Sparse GDN layers leave 0-dim tensors (no host read per layer); the step reads them back as floats, in order,
    whatever mix of tensors and floats the layers left."""
    stats = StepStats()
    assert stats.keep_ratio_values() == []
    stats.gdn_keep_ratios += [torch.tensor(0.25, dtype=torch.float64), 0.5, torch.tensor(1.0)]
    assert stats.keep_ratio_values() == [0.25, 0.5, 1.0]


def test_linear_rope_is_default_rope_at_scaled_positions():
    base = dict(head_dim=16, rotary_dim=16, theta=500.0)
    linear = RotaryEmbedding(RopeConfig(**base, rope_type="linear", factor=4.0))
    default = RotaryEmbedding(RopeConfig(**base))
    positions = torch.arange(0, 400, 7)
    for a, b in zip(linear(positions), default(positions / 4.0)):
        torch.testing.assert_close(a, b)


def test_partial_rope_rotates_only_the_first_channels():
    from longsparse.models.layers import apply_rotary

    rope = RotaryEmbedding(RopeConfig(head_dim=16, rotary_dim=4))
    x = torch.randn(9, 3, 16)
    y = apply_rotary(x, *rope(torch.arange(9)))
    assert torch.equal(y[..., 4:], x[..., 4:])
    torch.testing.assert_close(y[..., :4].norm(dim=-1), x[..., :4].norm(dim=-1))
    assert not torch.allclose(y[1:, :, :4], x[1:, :, :4])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rope_type="yarn"), "unsupported rope_type 'yarn'; supported: default, linear, llama3, longrope"),
        (dict(rotary_dim=7), "rotary_dim must be a positive even integer"),
        (dict(rotary_dim=32), "exceeds head_dim"),
        (dict(rope_type="llama3", factor=8.0), "needs original_max_position_embeddings"),
        (
            dict(rope_type="longrope", original_max_position_embeddings=8, max_position_embeddings=16,
                 short_factor=(1.0,) * 8, long_factor=(1.0,) * 3),
            "long_factor must hold rotary_dim / 2 = 8 values, got 3",
        ),
    ],
    ids=["yarn", "odd-rotary-dim", "rotary-too-wide", "llama3-no-original", "longrope-short-list"],
)  # fmt: skip
def test_rope_config_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RopeConfig(**{"head_dim": 16, "rotary_dim": 16, **kwargs})


def llama_raw(**changes) -> dict:
    return {**TINY, "architectures": ["LlamaForCausalLM"], **changes}


@pytest.mark.parametrize(
    "raw, message",
    [
        (llama_raw(num_key_value_heads=3), "must be a multiple of num_key_value_heads=3"),
        (llama_raw(hidden_act="gelu"), "unsupported hidden_act 'gelu'"),
        (llama_raw(use_sliding_window=True), "sliding-window attention"),
        (llama_raw(vocab_size=0), "vocab_size must be a positive integer"),
    ],
    ids=["kv-heads", "activation", "sliding-window", "vocab"],
)
def test_decoder_config_rejects(raw, message):
    with pytest.raises(ValueError, match=message):
        decoder_config_from_hf(raw, "LlamaForCausalLM")


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(layer_types=["linear_attention"] * 3), "layer_types has 3 entries for num_hidden_layers=4"),
        (dict(layer_types=["linear_attention", "sliding_attention"] * 2), "unsupported layer_types"),
        (dict(linear_num_value_heads=3), "must be a multiple of linear_num_key_heads=2"),
    ],
    ids=["layer-count", "layer-kind", "gdn-heads"],
)
def test_hybrid_config_rejects(changes, message):
    with pytest.raises(ValueError, match=message):
        hybrid_config_from_hf({**TINY, **TINY_GDN, **changes}, "Qwen3_5ForCausalLM")


def test_hybrid_layer_types_default_to_every_fourth_layer_attention():
    raw = {k: v for k, v in {**TINY, **TINY_GDN, "num_hidden_layers": 8}.items() if k != "layer_types"}
    config = hybrid_config_from_hf(raw, "Qwen3_5ForCausalLM")
    assert config.attention_layers == (3, 7)
    assert config.gdn_layers == (0, 1, 2, 4, 5, 6)
    assert config.rope.rotary_dim == TINY["head_dim"] // 4  # Qwen3.5's default partial_rotary_factor 0.25


def test_qwen3_reads_qk_norm_and_qwen2_qkv_bias():
    assert decoder_config_from_hf(TINY, "Qwen3ForCausalLM").qk_norm
    qwen2 = decoder_config_from_hf(TINY, "Qwen2ForCausalLM")
    assert isinstance(qwen2, DecoderConfig) and qwen2.qkv_bias and not qwen2.o_bias
