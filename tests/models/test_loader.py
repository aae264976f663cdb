"""Checkpoint loading: sharded and multimodal layouts round-trip; every broken checkpoint fails with a clear error."""

import json

import pytest
import torch
from safetensors.torch import save_file

from longsparse.engine import ModelRunner
from longsparse.models import CheckpointError, load_model, supported_architectures
from tests.helpers import rel_err
from tests.tiny_models import TINY, TINY_GDN, build, import_qwen35, random_ids, reference_logits, save


@pytest.fixture(scope="module")
def llama():
    return build("llama-gqa-bias", seed=3)


def write(path, config: dict, tensors: dict):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path


def config_of(model) -> dict:
    """The config.json that ``save_pretrained`` would write."""
    return {**json.loads(model.config.to_json_string()), "architectures": [type(model).__name__]}


@pytest.mark.parametrize("case", ["llama-gqa-bias", "qwen35"])
def test_sharded_checkpoint_round_trips(tmp_path, case):
    hf = build(case, seed=4)
    path = save(hf, tmp_path / "sharded", max_shard_size="20KB")
    assert (path / "model.safetensors.index.json").is_file()
    assert len(list(path.glob("model-*.safetensors"))) > 1
    ours = load_model(path)
    theirs = hf.state_dict()
    for name, p in ours.model.named_parameters():
        assert torch.equal(p, theirs[name]), name
    ids = random_ids(30, seed=5)
    assert rel_err(ModelRunner(ours.model).prefill([ids], all_logits=True).logits, reference_logits(hf, ids)) <= 1e-4


def test_conditional_generation_checkpoint_loads_its_text_model(tmp_path):
    """Qwen3.5 as released: ``Qwen3_5ForConditionalGeneration`` with ``model.language_model.*`` text weights, a vision
    tower (``model.visual.*``, skipped) and the text settings under ``text_config``."""
    import_qwen35()
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    from tests.tiny_models import randomize

    text = {**TINY, **TINY_GDN}
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, patch_size=4,
                  temporal_patch_size=1, spatial_merge_size=1, num_position_embeddings=16)  # fmt: skip
    hf = randomize(Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision)).eval(), 6)
    path = save(hf, tmp_path / "cg")
    ours = load_model(path)
    assert ours.config.architecture == "Qwen3_5ForConditionalGeneration"
    assert ours.config.layer_types == tuple(TINY_GDN["layer_types"])
    ids = random_ids(40, seed=7)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids])).logits[0]
    assert rel_err(ModelRunner(ours.model).prefill([ids], all_logits=True).logits, ref) <= 1e-4


def test_missing_config_json(tmp_path):
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_model(tmp_path)


def test_unsupported_architecture_lists_the_supported_ones(tmp_path, llama):
    config = {**config_of(llama), "architectures": ["GPT2LMHeadModel"]}
    path = write(tmp_path / "gpt2", config, llama.state_dict())
    with pytest.raises(CheckpointError, match="GPT2LMHeadModel") as err:
        load_model(path)
    for name in supported_architectures():
        assert name in str(err.value)


def test_missing_weight_is_named(tmp_path, llama):
    tensors = dict(llama.state_dict())
    del tensors["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(CheckpointError, match=r"missing .*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(write(tmp_path / "m", config_of(llama), tensors))


def test_unexpected_weight_is_named(tmp_path, llama):
    tensors = {**llama.state_dict(), "model.layers.0.self_attn.rotary.weight": torch.ones(3)}
    with pytest.raises(CheckpointError, match=r"unexpected .*model\.layers\.0\.self_attn\.rotary\.weight"):
        load_model(write(tmp_path / "m", config_of(llama), tensors))


def test_shape_mismatch_is_named(tmp_path, llama):
    tensors = dict(llama.state_dict())
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, TINY["hidden_size"])
    with pytest.raises(CheckpointError, match=r"k_proj\.weight has shape \[16, 64\], the model expects \[32, 64\]"):
        load_model(write(tmp_path / "m", config_of(llama), tensors))


def test_tied_checkpoint_with_a_different_lm_head_is_refused(tmp_path, llama):
    config = {**config_of(llama), "tie_word_embeddings": True}
    with pytest.raises(CheckpointError, match="ties word embeddings"):
        load_model(write(tmp_path / "m", config, llama.state_dict()))


def test_folder_without_safetensors(tmp_path, llama):
    (tmp_path / "config.json").write_text(json.dumps(config_of(llama)))
    with pytest.raises(CheckpointError, match="neither model.safetensors nor model.safetensors.index.json"):
        load_model(tmp_path)


def test_invalid_config_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_model(tmp_path)


def test_config_missing_a_required_key(tmp_path, llama):
    config = config_of(llama)
    del config["hidden_size"]
    with pytest.raises(CheckpointError, match="no 'hidden_size'"):
        load_model(write(tmp_path / "m", config, llama.state_dict()))


@pytest.fixture
def sharded(tmp_path, llama):
    return save(llama, tmp_path / "sharded", max_shard_size="20KB")


def test_index_that_is_not_json(sharded):
    (sharded / "model.safetensors.index.json").write_text("{")
    with pytest.raises(CheckpointError, match="not a safetensors index"):
        load_model(sharded)


def test_index_without_weight_map(sharded):
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(CheckpointError, match="weight_map"):
        load_model(sharded)


def test_index_naming_a_missing_shard(sharded):
    next(sharded.glob("model-*.safetensors")).unlink()
    with pytest.raises(CheckpointError, match=r"shard model-.*\.safetensors does not exist"):
        load_model(sharded)


def test_index_placing_a_tensor_in_the_wrong_shard(sharded):
    path = sharded / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    name = next(n for n, f in index["weight_map"].items() if f == shards[0])
    index["weight_map"][name] = shards[1]
    path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"lacks tensor.*{name}"):
        load_model(sharded)


def test_truncated_shard(sharded):
    shard = next(sharded.glob("model-*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:20])
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_model(sharded)


def test_neither_folder_nor_gguf(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="neither a checkpoint folder nor a .gguf file"):
        load_model(tmp_path / "weights.bin")


@pytest.mark.parametrize("dtype", [torch.bfloat16, "float16", "float32"])
def test_dtype_is_honoured(tmp_path, llama, dtype):
    ours = load_model(save(llama, tmp_path / "m"), dtype=dtype)
    want = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype)
    assert {p.dtype for p in ours.model.parameters()} == {want}
    assert ours.device == torch.device("cpu")


def test_unknown_dtype_name(tmp_path, llama):
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model(save(llama, tmp_path / "m"), dtype="float8")
