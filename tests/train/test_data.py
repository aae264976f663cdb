"""Token streams from text files and token-id arrays, and the deterministic draws of each step."""

import numpy as np
import pytest
import torch

from longsparse.models.tokenizer import load_tokenizer
from longsparse.tasks.streams import TokenStream, draw_positions, draw_sequence, load_token_stream, step_rng
from tests.tiny_models import write_tokenizer


def test_text_file_is_tokenized_without_special_tokens(tmp_path):
    write_tokenizer(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    (tmp_path / "corpus.txt").write_text("w3 w1 w4\nw1 w5 w9 w2 w6")
    stream = load_token_stream(tmp_path / "corpus.txt", tokenizer)
    assert stream.tokens.tolist() == [3, 1, 4, 1, 5, 9, 2, 6]
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        load_token_stream(tmp_path / "corpus.txt", None)
    with pytest.raises(FileNotFoundError, match="neither kjv nor shakespeare nor an existing file"):
        load_token_stream(tmp_path / "missing.txt", tokenizer)


def test_npy_token_ids(tmp_path):
    np.save(tmp_path / "ids.npy", np.array([5, 0, 7, 99], dtype=np.uint16))
    stream = load_token_stream(tmp_path / "ids.npy", None, vocab_size=100)
    assert stream.tokens.dtype == torch.int64 and stream.tokens.tolist() == [5, 0, 7, 99]
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 50\), got 0 .. 99"):
        load_token_stream(tmp_path / "ids.npy", None, vocab_size=50)
    np.save(tmp_path / "bad.npy", np.zeros((2, 3), dtype=np.int32))
    with pytest.raises(ValueError, match="1-D integer array"):
        load_token_stream(tmp_path / "bad.npy", None)
    with pytest.raises(FileNotFoundError, match="no token file"):
        load_token_stream(tmp_path / "none.npy", None)


def test_draws_depend_only_on_seed_step_and_index():
    stream = TokenStream("r", torch.arange(1000))
    eligible = torch.arange(100, 400)

    def draw(seed, step, index):
        rng = step_rng(seed, step, index)
        return draw_sequence(stream, 129, rng), draw_positions(eligible, 17, rng)

    (a_ids, a_pos), (b_ids, b_pos) = draw(0, 5, 1), draw(0, 5, 1)
    assert torch.equal(a_ids, b_ids) and torch.equal(a_pos, b_pos)
    assert not torch.equal(draw(0, 6, 1)[0], a_ids) and not torch.equal(draw(1, 5, 1)[0], a_ids)
    assert torch.equal(a_ids, torch.arange(int(a_ids[0]), int(a_ids[0]) + 129))
    assert a_pos.numel() == 17 and len(set(a_pos.tolist())) == 17 and torch.equal(a_pos, a_pos.sort().values)
    assert bool(((a_pos >= 100) & (a_pos < 400)).all())
    # asking for more positions than exist gives them all
    assert torch.equal(draw_positions(eligible, 1000, step_rng(0, 0, 0)), eligible)


def test_draw_errors():
    stream = TokenStream("r", torch.arange(10))
    with pytest.raises(ValueError, match="seq_len=11 exceeds the 10 tokens"):
        draw_sequence(stream, 11, step_rng(0, 0, 0))
    with pytest.raises(ValueError, match="no eligible query positions"):
        draw_positions(torch.zeros(0, dtype=torch.int64), 3, step_rng(0, 0, 0))
    with pytest.raises(ValueError, match="1-D int64"):
        TokenStream("x", torch.zeros(3))
