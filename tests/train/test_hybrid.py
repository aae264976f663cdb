"""Training the small hybrid: tokenizer, data mix, loss, resumable runs, and the exported checkpoint folder.

The runs use a micro model (one GDN layer with heads 2 / 4 of 16 channels, one attention layer) on 100K-character
slices of the two corpora, so a step takes about a second on a CPU; the default model's size is checked on the meta
device.
"""

import contextlib
import dataclasses
import itertools
import json

import numpy as np
import pytest
import torch

from longsparse.tasks.haystack import Corpus, kjv_text, shakespeare_text
from longsparse.tasks.ruler import TASKS
from longsparse.train import DataConfig, HybridDataMix, HybridModelConfig, RunConfig, TrainConfig, answer_text, train
from longsparse.train.hybrid import CHECKPOINT_FILE, LOG_FILE, make_optimizer, step_loss
from longsparse.train.hybrid_data import IGNORE, collate
from longsparse.train.model import build_model, import_qwen35_modeling
from longsparse.train.tokenizer import EOS_TOKEN, TextCodec, eos_id, load_trained, train_bpe
from tests.helpers import rel_err

MICRO_MODEL = HybridModelConfig(
    vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2, full_attention_interval=2,
    num_attention_heads=2,
    num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=16, max_position_embeddings=2048,
)  # fmt: skip
MICRO_DATA = DataConfig(
    seq_lens=(512,), stage_ends=(1.0,), tokens_per_step=1024, text_fraction=0.5, copy_fraction=0.0,
    extra_query_share=0.0, tasks=("niah_single_1", "niah_single_2", "niah_multivalue"),
)  # fmt: skip
MICRO_TRAIN = TrainConfig(steps=3, warmup_steps=1, log_every=1, checkpoint_every=2, eval_every=2, eval_per_task=1,
                          eval_lens=(512,), micro_batch_tokens=1024)  # fmt: skip
MICRO = RunConfig(MICRO_MODEL, MICRO_DATA, MICRO_TRAIN)


@pytest.fixture(scope="module")
def corpora():
    return [
        Corpus.from_text("kjv", kjv_text()[:100_000]),
        Corpus.from_text("shakespeare", shakespeare_text()[:100_000]),
    ]


@pytest.fixture(scope="module")
def tokenizer(corpora, tmp_path_factory):
    tok = train_bpe([" ".join(c.words) for c in corpora], 512)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def mix(tokenizer, corpora):
    from longsparse.train.tokenizer import load_trained

    return HybridDataMix(load_trained(tokenizer), MICRO_DATA, corpora)


def test_tokenizer_training_is_deterministic_and_splits_digits(corpora):
    texts = [" ".join(c.words[:8000]) for c in corpora]
    a, b = train_bpe(texts, 400), train_bpe(texts, 400)
    assert a.to_str() == b.to_str() and a.get_vocab_size() == 400
    assert train_bpe(texts, 420).to_str() != a.to_str()
    codec = TextCodec(a)
    ids = codec.encode("is: 4071925.")
    assert [a.id_to_token(i) for i in ids[-8:]] == list("4071925.")
    assert codec.decode(codec.encode("And God said, Let there be light")) == "And God said, Let there be light"
    assert a.id_to_token(eos_id(a)) == EOS_TOKEN
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe(texts, 100)


def test_batches_are_a_function_of_seed_and_step(mix, tokenizer, corpora):
    from longsparse.train.tokenizer import load_trained

    again = HybridDataMix(load_trained(tokenizer), MICRO_DATA, corpora)
    for step in (0, 3):
        a, b = mix.batch(step, 10), again.batch(step, 10)
        assert all(torch.equal(a[k], b[k]) for k in a)
    other = HybridDataMix(load_trained(tokenizer), dataclasses.replace(MICRO_DATA, seed=1), corpora)
    assert not torch.equal(mix.batch(0, 10)["input_ids"], other.batch(0, 10)["input_ids"])
    assert not torch.equal(mix.batch(0, 10)["input_ids"], mix.batch(1, 10)["input_ids"])


@pytest.mark.parametrize("prompt_loss", [True, False])
def test_rows_carry_loss_on_the_answer_and_on_text(tokenizer, corpora, prompt_loss):
    """Retrieval rows: the answer mask spells the answer (all references, in prompt order for these tasks) and the end
    token; the prompt's targets carry LM loss exactly when prompt_loss is on. Text rows: every position predicts the
    next token of the window, none of it an answer."""
    from longsparse.train.tokenizer import load_trained

    mix = HybridDataMix(load_trained(tokenizer), dataclasses.replace(MICRO_DATA, prompt_loss=prompt_loss), corpora)
    kinds = set()
    for step in range(4):
        batch = mix.batch(step, 10)
        assert batch["input_ids"].shape == batch["is_answer"].shape == (2, 512)
        for ids, targets, is_answer, is_text in zip(
            batch["input_ids"], batch["targets"], batch["is_answer"], batch["is_text"]
        ):
            kinds.add(bool(is_text))
            if is_text:
                assert torch.equal(targets[:-1], ids[1:]) and targets[-1] != IGNORE and not is_answer.any()
                continue
            where = torch.nonzero(is_answer).flatten()
            first, last = int(where[0]), int(where[-1])
            assert torch.equal(where, torch.arange(first, last + 1))  # one contiguous answer span
            assert torch.equal(targets[first:last], ids[first + 1 : last + 1])  # teacher forcing
            assert int(targets[last]) == mix.eos and (targets[last + 1 :] == IGNORE).all()
            if prompt_loss:
                assert torch.equal(targets[:first], ids[1 : first + 1])
            else:
                assert (targets[:first] == IGNORE).all()
            answer = mix.codec.decode(targets[first:last].tolist())
            prompt = mix.codec.decode(ids[: first + 1].tolist())
            assert prompt.endswith(("is", "are")) and answer.startswith(" ") and answer.endswith(".")
            values = answer[1:-1].split(", ")
            assert all(f"is: {v}." in prompt for v in values)
            assert values == sorted(values, key=lambda v: prompt.find(f"is: {v}."))
            assert (ids[last + 1 :] == mix.eos).all()  # padding after the end token
    assert kinds == {True, False}


@pytest.mark.parametrize("copy_tokens", ["uniform", "stream"])
def test_copy_rows_repeat_pieces_of_random_tokens_with_loss_on_the_pieces(tokenizer, corpora, copy_tokens):
    """A copy row: random tokens, then pieces of them (8-32 tokens each) from varying places, so no single look-back
    distance predicts the second half; loss on the second half only. Uniform draws rarely repeat a token in the first
    half; stream draws repeat the frequent ones."""
    from longsparse.train.hybrid_data import COPY_PIECE
    from longsparse.train.tokenizer import load_trained

    cfg = dataclasses.replace(MICRO_DATA, text_fraction=0.0, copy_fraction=1.0, copy_tokens=copy_tokens)
    mix = HybridDataMix(load_trained(tokenizer), cfg, corpora)
    half = (512 + 1) // 2
    distinct = []
    for seed in range(3):
        row = mix.copy_row(np.random.default_rng(seed), 512)
        ids = row.ids
        assert len(ids) == 513 and row.loss_from == half and row.is_copy and not row.is_text
        assert set(ids) <= set(mix.text_ids.tolist())
        first, second = ids[:half], ids[half:]
        distinct.append(len(set(first)) / half)

        def found_at(piece, first=first):  # where ``piece`` occurs in the first half
            return [i for i in range(half - len(piece) + 1) if first[i : i + len(piece)] == piece]

        pos, distances = 0, set()  # split the second half greedily into the longest pieces of the first
        while pos < len(second):
            length = max(n for n in range(1, COPY_PIECE[1] + 1) if found_at(second[pos : pos + n]))
            assert length >= min(COPY_PIECE[0], len(second) - pos)
            distances.add(half + pos - found_at(second[pos : pos + length])[0])
            pos += length
        assert len(distances) > 3  # many distances back, not one
    vocab = len(mix.vocab_ids)  # the distinct tokens of the text: what uniform draws pick from
    uniform = vocab / half * (1 - np.exp(-half / vocab))  # expected share of distinct tokens among `half` draws
    if copy_tokens == "uniform":
        assert all(abs(d - uniform) < 0.05 for d in distinct), (distinct, uniform)
    else:
        assert max(distinct) < uniform - 0.08, (distinct, uniform)  # 8,192 tokens: 0.98 against 0.65
    batch = collate([mix.copy_row(np.random.default_rng(0), 512)], 512, mix.eos)
    targets = batch["targets"][0]
    assert (targets[: half - 1] == IGNORE).all() and (targets[half - 1 :] != IGNORE).all()
    assert batch["is_copy"].tolist() == [True] and batch["is_text"].tolist() == [False]
    with pytest.raises(ValueError, match="copy_tokens"):
        DataConfig(copy_tokens="zipf")
    with pytest.raises(ValueError, match="copy_fraction"):
        DataConfig(text_fraction=0.6, copy_fraction=0.5)


def test_multiquery_answers_follow_the_question_order(mix):
    """niah_multiquery asks four keys: the answer gives their values in the question's order, which is not the order
    the needles appear in (sample 0 here has them in another order)."""
    sample = mix.generator(5, 1).sample("niah_multiquery", 900, 0)
    keys = sample.prompt.rsplit("What are all the special magic numbers for ", 1)[1].split(" mentioned")[0]
    keys = [k.removeprefix("and ") for k in keys.split(", ")]
    values = [sample.prompt.split(f"for {k} is: ", 1)[1].split(".", 1)[0] for k in keys]
    assert answer_text(sample) == " " + ", ".join(values) + "."
    assert values != sorted(values, key=lambda v: sample.prompt.find(f"is: {v}."))


def test_answer_text_follows_ruler_answer_prefixes(mix):
    vt = mix.generator(5, 0).sample("vt", 1100, 0)
    assert answer_text(vt) == " ".join(vt.references) and vt.prompt.endswith("they are: ")
    with pytest.raises(ValueError, match="no answer format"):
        answer_text(dataclasses.replace(vt, task="cwe"))


def test_stages_too_short_for_every_task_hold_copy_and_text_rows(tokenizer, corpora):
    """The copy drill's short first stage: no retrieval row fits 64 tokens, so its rows are copy rows (the retrieval
    share) and text rows; the next stage holds retrieval rows again."""
    from longsparse.train.tokenizer import load_trained

    cfg = dataclasses.replace(MICRO_DATA, seq_lens=(64, 512), stage_ends=(0.5, 1.0), text_fraction=0.2,
                              copy_fraction=0.3)  # fmt: skip
    assert cfg.tasks_at(64) == () and cfg.tasks_at(512) == cfg.tasks
    mix = HybridDataMix(load_trained(tokenizer), cfg, corpora)
    short, long = mix.batch(0, 4), mix.batch(2, 4)
    assert short["input_ids"].shape == (16, 64) and long["input_ids"].shape == (2, 512)
    kinds = short["is_copy"].int() + short["is_text"].int()
    assert (kinds == 1).all() and 4 <= int(short["is_copy"].sum()) <= 15  # ~80% copy rows
    assert not short["is_answer"].any()
    rows = [mix.row(s, r, 512, 2) for s in range(2, 4) for r in range(2)] + [mix.row(9, r, 512, 8) for r in range(8)]
    assert any(row.answer_spans for row in rows)
    with pytest.raises(ValueError, match="answer_room"):
        DataConfig(seq_lens=(256, 512), stage_ends=(0.5, 1.0), answer_room=300)
    with pytest.raises(ValueError, match="increase from at least 16"):
        DataConfig(seq_lens=(8, 512), stage_ends=(0.5, 1.0))


def test_curriculum_lengths_and_config_checks():
    cfg = DataConfig(seq_lens=(512, 1024, 4096), stage_ends=(0.25, 0.5, 1.0), tokens_per_step=8192)
    assert [cfg.seq_len(s, 8) for s in range(8)] == [512, 512, 1024, 1024, 4096, 4096, 4096, 4096]
    assert [cfg.rows(t) for t in (512, 1024, 4096)] == [16, 8, 2]
    assert "vt" not in cfg.tasks_at(512) and "vt" in cfg.tasks_at(1024)
    for bad in (dict(seq_lens=(1024, 512), stage_ends=(0.5, 1.0)), dict(stage_ends=(0.1, 0.2, 0.3, 0.4, 0.5, 0.9)),
                dict(tokens_per_step=4096), dict(tasks=("qa_1",)), dict(corpora=("essays",))):  # fmt: skip
        with pytest.raises(ValueError):
            DataConfig(**bad)
    schedule = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    assert schedule.lr_at(0) == pytest.approx(1e-4) and schedule.lr_at(9) == pytest.approx(1e-3)
    assert schedule.lr_at(99) == pytest.approx(1e-4, rel=1e-2) and schedule.lr_at(55) == pytest.approx(5.5e-4)


def test_default_model_has_qwen35_gdn_geometry_and_fits_50_mb():
    modeling = import_qwen35_modeling(use_fla=False)
    cfg = HybridModelConfig()
    hf = cfg.to_transformers(eos_token_id=0)
    with torch.device("meta"):
        model = modeling.Qwen3_5ForCausalLM(hf)
    params = sum(p.numel() for p in model.parameters())
    assert 20e6 < params and 2 * params <= 50e6
    assert cfg.layer_types == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + [
        "full_attention"
    ]
    gdn = model.model.layers[0].linear_attn
    assert (gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim) == (16, 32, 128, 128)


def test_steps_reduce_the_loss_on_a_repeated_batch(mix):
    model = build_model(MICRO_MODEL, mix.eos, torch.device("cpu"), seed=0)
    optimizer = make_optimizer(model, dataclasses.replace(MICRO_TRAIN, lr=3e-3))
    batch = mix.batch(0, 10)
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        losses.append(step_loss(model, batch, 2, 1.0, "cpu", contextlib.nullcontext)["loss"])
        optimizer.step()
    assert losses[2] < losses[1] < losses[0]


def test_micro_batches_give_the_same_loss_and_gradient(mix):
    model = build_model(MICRO_MODEL, mix.eos, torch.device("cpu"), seed=0)
    batch = mix.batch(2, 10)
    grads, terms = [], []
    for rows in (2, 1):
        model.zero_grad()
        terms.append(step_loss(model, batch, rows, 0.5, "cpu", contextlib.nullcontext))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert terms[0]["loss"] == pytest.approx(terms[1]["loss"], rel=1e-5)
    assert rel_err(grads[1], grads[0]) < 1e-5


def test_copy_loss_is_the_mean_over_copy_rows_targets(tokenizer, corpora):
    """step_loss logs copy rows' loss apart (it is in the text loss too): the mean cross-entropy of their targets."""
    from longsparse.train.tokenizer import load_trained

    cfg = dataclasses.replace(MICRO_DATA, tokens_per_step=2048, text_fraction=0.3, copy_fraction=0.4)
    mix = HybridDataMix(load_trained(tokenizer), cfg, corpora)
    batch = next(b for b in (mix.batch(s, 10) for s in range(10)) if 0 < int(b["is_copy"].sum()) < 4)
    model = build_model(MICRO_MODEL, mix.eos, torch.device("cpu"), seed=0)
    terms = step_loss(model, batch, 1, 1.0, "cpu", contextlib.nullcontext)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"][batch["is_copy"]]).logits
    targets = batch["targets"][batch["is_copy"]]
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
    assert terms["copy_targets"] == int((targets != IGNORE).sum()) > 0
    assert terms["copy_loss"] == pytest.approx(float(want), rel=1e-4)


@pytest.fixture(scope="module")
def straight_run(tokenizer, corpora, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    result = train(out, MICRO, device="cpu", tokenizer=tokenizer, corpora=corpora, progress=False)
    return out, result


def test_a_run_can_start_from_another_runs_weights(straight_run, corpora, tmp_path):
    """init_from (a copy drill before the main run): the new run starts from the other run's final weights and
    tokenizer, with its own step count and a fresh optimizer; a run of another model shape is refused."""
    drill, _ = straight_run
    main = dataclasses.replace(MICRO, data=dataclasses.replace(MICRO_DATA, copy_fraction=0.3, text_fraction=0.2))
    result = train(tmp_path / "main", main, device="cpu", corpora=corpora, progress=False, init_from=drill,
                   stop_after=0)  # fmt: skip
    assert result.step == 0
    start = torch.load(tmp_path / "main" / CHECKPOINT_FILE, weights_only=True)
    done = torch.load(drill / CHECKPOINT_FILE, weights_only=True)
    assert start["step"] == 0 and not start["optimizer"]["state"]
    assert all(torch.equal(start["model"][k], v) for k, v in done["model"].items())
    assert (tmp_path / "main" / "tokenizer.json").read_text() == (drill / "tokenizer.json").read_text()
    first = json.loads((tmp_path / "main" / LOG_FILE).read_text().splitlines()[0])
    assert first["init_from"] == str(drill) and first["init_step"] == 3
    wider = dataclasses.replace(MICRO, model=dataclasses.replace(MICRO_MODEL, hidden_size=48))
    with pytest.raises(ValueError, match="another model configuration"):
        train(tmp_path / "wide", wider, device="cpu", corpora=corpora, progress=False, init_from=drill, stop_after=0)
    assert not (tmp_path / "wide").exists()
    with pytest.raises(FileNotFoundError, match="checkpoint.pt.*model.safetensors"):
        train(tmp_path / "none", MICRO, device="cpu", corpora=corpora, progress=False, init_from=tmp_path / "x")


def test_a_run_can_start_from_an_exported_model(straight_run, corpora, tmp_path):
    """init_from an exported folder (bfloat16 safetensors without the tied output head, its tokenizer): the new run's
    weights are the export's, the head tied to the embedding again; the log has no step to name."""
    from safetensors.torch import load_file

    done, _ = straight_run
    export = load_file(str(done / "model" / "model.safetensors"))
    assert "lm_head.weight" not in export and all(t.dtype == torch.bfloat16 for t in export.values())
    train(tmp_path / "next", MICRO, device="cpu", corpora=corpora, progress=False, init_from=done / "model",
          stop_after=0)  # fmt: skip
    start = torch.load(tmp_path / "next" / CHECKPOINT_FILE, weights_only=True)["model"]
    assert all(torch.equal(start[k], v.float()) for k, v in export.items())
    assert torch.equal(start["lm_head.weight"], start["model.embed_tokens.weight"])
    ours, theirs = load_trained(tmp_path / "next"), load_trained(done)  # transformers' file: the same tokens
    text = "In the beginning, 1234567 said Hamlet."
    assert ours.get_vocab() == theirs.get_vocab() and ours.encode(text).ids == theirs.encode(text).ids
    assert json.loads((tmp_path / "next" / LOG_FILE).read_text().splitlines()[0])["init_step"] is None
    other = dataclasses.replace(MICRO, model=dataclasses.replace(MICRO_MODEL, max_position_embeddings=4096))
    with pytest.raises(ValueError, match="max_position_embeddings: 2048 there, 4096 here"):
        train(tmp_path / "other", other, device="cpu", corpora=corpora, progress=False, init_from=done / "model",
              stop_after=0)  # fmt: skip


def test_resumed_run_takes_the_same_steps(straight_run, tokenizer, corpora, tmp_path):
    """Stopped by the time limit after one step, then by stop_after at 2, then run to the end: the same weights and
    AdamW state as one uninterrupted run."""
    out, result = straight_run
    assert result.finished and result.step == 3
    ticks = itertools.count(step=1000.0)  # every clock reading is 1000 s later: 4,000 s have passed after one step
    first = train(tmp_path, MICRO, device="cpu", tokenizer=tokenizer, corpora=corpora, progress=False,
                  time_limit_s=4010, clock=lambda: next(ticks))  # fmt: skip
    assert (first.step, first.finished) == (1, False)
    assert train(tmp_path, MICRO, device="cpu", corpora=corpora, progress=False, stop_after=2).step == 2
    assert train(tmp_path, MICRO, device="cpu", corpora=corpora, progress=False).finished
    a = torch.load(out / CHECKPOINT_FILE, weights_only=True)
    b = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)
    assert a["step"] == b["step"] == 3 and a["tokens"] == b["tokens"] == 3 * 1024
    for name, value in a["model"].items():
        assert torch.equal(value, b["model"][name]), name
    assert torch.equal(a["optimizer"]["state"][0]["exp_avg_sq"], b["optimizer"]["state"][0]["exp_avg_sq"])
    log = [json.loads(line) for line in (tmp_path / LOG_FILE).read_text().splitlines()]
    assert [r["event"] for r in log if "event" in r] == ["start", "paused", "start", "paused", "start", "finished"]
    assert [r["step"] for r in log if "loss" in r] == [1, 2, 3]
    evals = [r for r in log if "held_out_exact_match" in r]
    assert [r["step"] for r in evals] == [2, 3] and "mean@512" in evals[0]["held_out_exact_match"]
    tokens = evals[0]["held_out_token_accuracy"]
    assert tokens.keys() == evals[0]["held_out_exact_match"].keys() and all(0 <= v <= 1 for v in tokens.values())
    with pytest.raises(ValueError, match=r"another configuration .*train\.lr: 0\.0015 -> 0\.01\)"):
        train(tmp_path, dataclasses.replace(MICRO, train=dataclasses.replace(MICRO_TRAIN, lr=1e-2)), device="cpu",
              corpora=corpora, progress=False)  # fmt: skip


def test_a_slow_first_step_does_not_set_the_pace(tokenizer, corpora, tmp_path):
    """The first step of a call compiles (minutes on a fresh GPU machine): 100 s for it, then 1 s per clock reading,
    inside a 150 s limit, the call goes on to the end instead of stopping for fear of two more 100 s steps."""
    readings = itertools.chain([0.0, 0.0, 0.0], itertools.count(100.0))
    result = train(tmp_path, MICRO, device="cpu", tokenizer=tokenizer, corpora=corpora, progress=False,
                   time_limit_s=150, clock=lambda: next(readings))  # fmt: skip
    assert result.finished and result.step == MICRO.train.steps


def test_export_loads_with_longsparse_and_matches_transformers(straight_run, mix):
    """The exported folder (bfloat16 weights, tokenizer, log): longsparse.load_model's float32 logits on a retrieval
    prompt equal transformers' own float32 forward on the same folder, and its tokenizer is the trained one."""
    import transformers

    from longsparse.models import load_model
    from longsparse.models.modes import ExecutionModes

    out, _ = straight_run
    folder = out / "model"
    assert {"config.json", "model.safetensors", "tokenizer.json", LOG_FILE} <= {p.name for p in folder.iterdir()}
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["Qwen3_5ForCausalLM"]
    ours = load_model(folder, dtype="float32", device="cpu", modes=ExecutionModes())
    hf = transformers.Qwen3_5ForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    sample = mix.generator(9, 1).sample("niah_single_2", 700, 0)
    ids = mix.codec.encode(sample.prompt)
    assert ours.tokenizer.encode(sample.prompt) == ids and mix.eos in ours.eos_token_ids
    assert len(ids) % 64 and len(ids) > 128  # several GDN chunks, the last one partial
    from longsparse.engine import ModelRunner

    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    got = ModelRunner(ours.model).prefill([ids], all_logits=True).logits
    assert rel_err(got, ref) <= 1e-4


def test_cli_builds_the_preset_with_overrides():
    from longsparse.cli import build_parser
    from longsparse.train.hybrid_cli import build_config

    args = build_parser().parse_args(["train-hybrid", "--preset", "smoke", "--steps", "30", "--seq-lens", "512,1k",
                                      "--stage-ends", "0.4,1", "--hidden-size", "96", "--seed", "3"])  # fmt: skip
    cfg = build_config(args)
    assert cfg.train.steps == 30 and cfg.train.seed == 3 and cfg.data.seed == 3
    assert cfg.data.seq_lens == (512, 1024) and cfg.data.stage_ends == (0.4, 1.0)
    assert cfg.model.hidden_size == 96 and cfg.model.linear_num_value_heads == 32
    default = build_config(build_parser().parse_args(["train-hybrid", "--out", "/nonexistent/run"]))
    assert default == RunConfig() and default.data.tasks == tuple(t for t in default.data.tasks if t in TASKS)


def test_cli_continues_a_run_with_its_saved_options(tmp_path):
    """A folder holding a run: ``--out`` alone rebuilds its configuration (tuples and all) from run.json, an option
    given overrides it (and is then refused by train, naming the field), and --preset starts from the preset."""
    from longsparse.cli import build_parser
    from longsparse.train.hybrid import RUN_FILE, config_differences, load_run_config
    from longsparse.train.hybrid_cli import build_config

    assert load_run_config(tmp_path) is None
    (tmp_path / RUN_FILE).write_text(json.dumps({"config": MICRO.to_dict()}))
    assert load_run_config(tmp_path) == MICRO

    def parse(*options):
        return build_config(build_parser().parse_args(["train-hybrid", "--out", str(tmp_path), *options]))

    assert parse() == MICRO and isinstance(parse().data.seq_lens, tuple)
    changed = parse("--steps", "7", "--seq-lens", "256")
    assert changed.train.steps == 7 and changed.data.seq_lens == (256,) and changed.model == MICRO.model
    assert config_differences(MICRO.to_dict(), changed.to_dict()) == ["data.seq_lens: (512,) -> (256,)",
                                                                      "train.steps: 3 -> 7"]  # fmt: skip
    assert parse("--preset", "default") == RunConfig()


@pytest.mark.gpu
def test_training_on_the_gpu_lowers_the_loss_and_exports_a_loadable_model(tokenizer, corpora, tmp_path):
    """bf16 autocast on CUDA (FLA's kernels when this process's transformers import chose them), real GDN geometry:
    ten steps at 1K tokens lower the loss, and the export runs in longsparse on the GPU in bfloat16 as close to
    transformers' float32 logits as transformers' own bfloat16 run is (twice that drift)."""
    import transformers

    from longsparse.engine import ModelRunner
    from longsparse.models import load_model

    model = dataclasses.replace(HybridModelConfig(), vocab_size=512, hidden_size=128, intermediate_size=256)
    data = dataclasses.replace(MICRO_DATA, seq_lens=(1024,), tokens_per_step=8192, text_fraction=0.25)
    schedule = dataclasses.replace(MICRO_TRAIN, steps=10, lr=3e-3, eval_every=10, eval_lens=(1024,),
                                   micro_batch_tokens=8192)  # fmt: skip
    result = train(tmp_path, RunConfig(model, data, schedule), device="cuda", tokenizer=tokenizer, corpora=corpora,
                   progress=False)  # fmt: skip
    assert result.finished
    log = [json.loads(line) for line in (tmp_path / LOG_FILE).read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert all(torch.isfinite(torch.tensor(losses))) and min(losses[-3:]) < losses[0]
    folder = result.export_dir
    ours = load_model(folder, device="cuda", dtype="bfloat16")
    hf = transformers.Qwen3_5ForCausalLM.from_pretrained(str(folder), dtype=torch.float32).cuda().eval()
    ids = torch.tensor([list(range(1, 400))], device="cuda")
    with torch.no_grad():
        ref = hf(ids).logits[0].float()
        theirs = hf.to(torch.bfloat16)(ids).logits[0].float()
    got = ModelRunner(ours.model).prefill([ids[0].tolist()], all_logits=True).logits.float()
    assert rel_err(got, ref) <= 2 * rel_err(theirs, ref) + 1e-3  # within transformers' own bf16 drift
