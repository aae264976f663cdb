"""Reading hybrid training logs back and plotting them."""

import json

import pytest

from longsparse.train.curves import main, read_log


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_read_log_keeps_the_last_record_of_a_step_and_places_evaluations(tmp_path):
    log = read_log(
        _write(
            tmp_path / "train_log.jsonl",
            [
                {"event": "start", "step": 0},
                {"step": 10, "loss": 5.0, "lm_loss": 3.0, "answer_loss": 2.0, "tokens": 1000},
                {"step": 20, "loss": 4.0, "lm_loss": 2.5, "answer_loss": None, "tokens": 2000},
                {"step": 20, "held_out_exact_match": {"mean@1024": 0.25, "vt@1024": 0.5, "mean@4096": 0.0}},
                {"event": "paused", "step": 20},
                {"event": "start", "step": 10},  # resumed from an earlier checkpoint: steps 11-20 again
                {"step": 20, "loss": 3.9, "lm_loss": 2.4, "answer_loss": 1.5, "tokens": 2000},
                {"step": 30, "loss": 3.0, "lm_loss": 2.0, "answer_loss": 1.0, "copy_loss": 8.9, "tokens": 3000},
                {
                    "step": 40,
                    "held_out_exact_match": {"mean@1024": 0.75, "mean@4096": 0.5},
                    "held_out_token_accuracy": {"mean@1024": 0.9, "mean@4096": 0.8, "vt@1024": 1.0},
                },
            ],
        )
    )
    assert log.tokens == [1000, 2000, 3000]
    assert log.lm_loss == [3.0, 2.4, 2.0] and log.answer_loss == [2.0, 1.5, 1.0]
    assert log.copy_loss == [None, None, 8.9]  # logs before copy rows have none
    assert log.eval_tokens == [2000, 4000]  # step 40 was not logged: tokens per step of the last logged step
    assert log.exact_match == {1024: [0.25, 0.75], 4096: [0.0, 0.5]}
    assert log.token_accuracy == {1024: [0.9], 4096: [0.8]}  # the first evaluation's log line predates it


def test_bad_logs_are_named(tmp_path):
    with pytest.raises(ValueError, match="no logged training step"):
        read_log(_write(tmp_path / "a.jsonl", [{"event": "start", "step": 0}]))
    (tmp_path / "b.jsonl").write_text('{"step": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"b.jsonl:2: not JSON"):
        read_log(tmp_path / "b.jsonl")


def test_cli_writes_the_plot(tmp_path, capsys):
    path = _write(tmp_path / "log.jsonl", [{"step": 10, "loss": 5.0, "lm_loss": 3.0, "answer_loss": 2.0,
                                           "tokens": 1000}])  # fmt: skip
    out = tmp_path / "curves.png"
    assert main([f"run={path}", "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000 and "wrote" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(path), "--out", str(out)])  # no label
