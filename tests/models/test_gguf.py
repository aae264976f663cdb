"""GGUF loading through transformers' reader, on tiny float32 GGUF files written here from transformers' own tiny
models the way llama.cpp's converter writes them (q/k rows permuted for ``llama``), so the whole GGUF path runs in
seconds; the real quantised SmolLM2 file is covered in tests/engine/test_smollm2.py."""

import numpy as np
import pytest

from longsparse.engine import ModelRunner
from longsparse.models import CheckpointError, load_model
from tests.helpers import rel_err
from tests.tiny_models import EOS, build, random_ids, reference_logits

gguf = pytest.importorskip("gguf")

# GGUF name of each per-layer Hugging Face parameter (llama.cpp's tensor naming)
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}  # fmt: skip


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores q/k rows of ``llama`` models interleaved per rotary pair instead of rotate-half halves."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, hf, arch: str):
    c = hf.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {arch}")
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    tokens = ["w", "1", "w1"] + [f"t{i}" for i in range(97)] + ["<eos>"]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges(["w 1"])
    writer.add_token_types([1] * 100 + [3])
    writer.add_eos_token_id(EOS)
    tied = c.tie_word_embeddings
    for name, tensor in hf.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        w = tensor.numpy()
        if arch == "llama" and name.endswith("q_proj.weight"):
            w = llama_cpp_permute(w, c.num_attention_heads)
        if arch == "llama" and name.endswith("k_proj.weight"):
            w = llama_cpp_permute(w, c.num_key_value_heads)
        if name in TOP_NAMES:
            gguf_name = TOP_NAMES[name]
        else:
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            gguf_name = f"blk.{layer}.{LAYER_NAMES[rest]}"
        writer.add_tensor(gguf_name, np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    "case, arch, architecture",
    [
        ("llama-gqa-bias", "llama", "LlamaForCausalLM"),
        ("qwen2", "qwen2", "Qwen2ForCausalLM"),
        ("qwen3", "qwen3", "Qwen3ForCausalLM"),
    ],
    ids=["llama-permuted-qk", "qwen2-qkv-bias", "qwen3-qk-norm"],
)
def test_gguf_gives_the_logits_of_the_model_it_was_written_from(tmp_path, case, arch, architecture):
    overrides = dict(attention_bias=False, mlp_bias=False) if arch == "llama" else {}
    hf = build(case, seed=14, **overrides)
    ours = load_model(write_gguf(tmp_path / "tiny.gguf", hf, arch))
    assert ours.config.architecture == architecture
    assert ours.eos_token_ids == (EOS,)
    ids = random_ids(33, seed=15)
    out = ModelRunner(ours.model).prefill([ids], all_logits=True).logits
    assert rel_err(out, reference_logits(hf, ids)) <= 1e-4


def test_tied_gguf_has_no_output_tensor(tmp_path):
    hf = build("llama-gqa-bias", seed=16, attention_bias=False, mlp_bias=False, tie_word_embeddings=True)
    ours = load_model(write_gguf(tmp_path / "tied.gguf", hf, "llama"))
    assert ours.config.tie_word_embeddings
    assert ours.model.lm_head.weight is ours.model.model.embed_tokens.weight
    ids = random_ids(20, seed=17)
    assert rel_err(ModelRunner(ours.model).prefill([ids]).logits[0], reference_logits(hf, ids)[-1]) <= 1e-4


def test_unsupported_gguf_architecture(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    writer.add_block_count(1)
    writer.add_context_length(16)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    writer.add_feed_forward_length(16)
    writer.add_tensor("token_embd.weight", np.zeros((3, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    message = "GGUF model type 'gpt2' is not supported; supported: llama, qwen2, qwen3"
    with pytest.raises(CheckpointError, match=message):
        load_model(tmp_path / "gpt2.gguf")


def test_file_that_is_not_gguf(tmp_path):
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        load_model(tmp_path / "broken.gguf")
