"""RULER generators: length in the real tokenizer, needle depth, determinism, and that every prompt holds its answer."""

from __future__ import annotations

import dataclasses
import re

import pytest

from longsparse.tasks.ruler import (
    ALL_TASKS,
    DEPTHS,
    MISSING_TASKS,
    TASKS,
    CommonWordsConfig,
    FreqWordsConfig,
    NiahConfig,
    RulerGenerator,
    VariableTrackingConfig,
)

from .fakes import RegexTokenizer, solve


def _within_one_percent(sample):
    assert sample.length <= sample.target_length, (sample.id, sample.length)
    assert sample.length >= 0.99 * sample.target_length, (sample.id, sample.length)


@pytest.mark.parametrize("target", [1024, 2048, 4096], ids=["T1K", "T2K", "T4K"])
@pytest.mark.parametrize("task", list(TASKS))
def test_length_within_one_percent_smollm2(smollm2_generator, smollm2_tokenizer, task, target):
    s = smollm2_generator.sample(task, target, index=3)
    assert s.prompt_tokens == len(smollm2_tokenizer.encode(s.prompt))  # measured, not estimated
    _within_one_percent(s)


@pytest.mark.parametrize("task", ["niah_multikey_2", "niah_multikey_3"])
def test_coarse_distractor_lines_still_meet_short_targets(smollm2_generator, task):
    """Haystacks of whole 20-90-token lines: which lines are used is chosen so that 1K is met within 1%."""
    for index in range(10):
        _within_one_percent(smollm2_generator.sample(task, 1024, index))


@pytest.mark.parametrize("target", [1500, 3001, 8192], ids=["T1500", "T3001", "T8K"])
@pytest.mark.parametrize("task", ["niah_single_2", "niah_multikey_3", "vt", "cwe", "fwe"])
def test_length_within_one_percent_qwen(qwen_generator, qwen_tokenizer, task, target):
    s = qwen_generator.sample(task, target, index=0)
    assert s.prompt_tokens == len(qwen_tokenizer.encode(s.prompt))
    _within_one_percent(s)


@pytest.mark.slow
def test_length_within_one_percent_at_32k(qwen_generator):
    for task in ("niah_single_2", "niah_multikey_2", "cwe", "fwe"):
        _within_one_percent(qwen_generator.sample(task, 32768, index=1))


def _measured_depth(sample, count) -> float:
    """Fraction of the haystack's tokens (needle excluded) that come before the needle, by re-tokenizing."""
    p = sample.prompt
    start = p.index("afterwards.\n") + len("afterwards.\n")
    end = p.rindex("\nWhat is the special magic")
    needle = re.search(r"One of the special magic numbers for \S+ is: " + sample.references[0] + r"\.", p)
    return count(p[start : needle.start()]) / (count(p[start:end]) - count(needle.group(0)))


# Needles go to the nearest noise sentence (~5 tokens) or essay clause (~40 tokens): the tolerance is that
# granularity over the haystack length.
@pytest.mark.parametrize(
    "task, target, tolerance",
    [
        ("niah_single_1", 1024, 0.008),
        ("niah_single_1", 4096, 0.002),
        ("niah_single_2", 1024, 0.05),
        ("niah_single_2", 2048, 0.025),
        ("niah_single_2", 4096, 0.012),
    ],
    ids=["noise-T1K", "noise-T4K", "essay-T1K", "essay-T2K", "essay-T4K"],
)
@pytest.mark.parametrize("depth", [0.0, 0.13, 0.5, 0.77, 1.0])
def test_needle_is_at_the_requested_depth(smollm2_generator, smollm2_tokenizer, task, target, tolerance, depth):
    count = lambda text: len(smollm2_tokenizer.encode(text))  # noqa: E731
    config = dataclasses.replace(TASKS[task], depths=(depth,))
    s = smollm2_generator.sample(task, target, index=7, config=config)
    assert s.prompt.count(s.references[0]) == 1
    measured = _measured_depth(s, count)
    assert abs(measured - s.depths[0]) < 0.003  # the recorded depth is the real one
    assert abs(measured - depth) <= tolerance


def test_default_depths_come_from_rulers_grid(smollm2_generator):
    assert len(DEPTHS) == 40 and DEPTHS[0] == 0.0 and DEPTHS[-1] == 1.0 and DEPTHS[20] == 0.51
    s = smollm2_generator.sample("niah_multivalue", 4096, index=0)
    assert len(s.depths) == 4 and list(s.depths) == sorted(s.depths)
    assert all(min(abs(d - g) for g in DEPTHS) < 0.02 for d in s.depths)


@pytest.mark.parametrize("task", list(TASKS))
def test_every_prompt_holds_its_answer(qwen_generator, task):
    """A reader that only sees the prompt recovers exactly the references (so scoring can reach 100%)."""
    for index in range(2):
        s = qwen_generator.sample(task, 2048, index)
        answer = solve(s.prompt)
        assert all(r in answer for r in s.references), (s.id, s.references, answer)
        if task in ("vt", "cwe", "fwe"):
            assert sorted(answer.replace(",", " ").split()) == sorted(s.references)


def test_niah_structure(qwen_generator):
    s = qwen_generator.sample("niah_multiquery", 4096, 0)
    assert len(s.references) == 4 and len(set(s.references)) == 4
    assert all(re.fullmatch(r"\d{7}", r) for r in s.references)
    assert s.prompt.startswith("Some special magic numbers are hidden")
    assert s.prompt.endswith("mentioned in the provided text are")
    single = qwen_generator.sample("niah_single_3", 4096, 0)
    assert single.prompt.startswith("A special magic uuid is hidden")
    assert single.prompt.endswith("mentioned in the provided text is")
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", single.references[0])
    multikey = qwen_generator.sample("niah_multikey_3", 4096, 0)
    needles = re.findall(r"One of the special magic uuids for ([\w-]+) is", multikey.prompt)
    assert len(needles) > 20 and len(set(needles)) == len(needles)  # distractors never repeat the asked key


def test_same_seed_same_samples_other_seed_other_samples(qwen_tokenizer):
    a = RulerGenerator(qwen_tokenizer, seed=1)
    b = RulerGenerator(qwen_tokenizer, seed=1)
    c = RulerGenerator(qwen_tokenizer, seed=2)
    for task in ("niah_single_2", "niah_multikey_3", "vt", "fwe"):
        assert a.sample(task, 2048, 5) == b.sample(task, 2048, 5)
        assert a.sample(task, 2048, 5).prompt != c.sample(task, 2048, 5).prompt
        assert a.sample(task, 2048, 5).prompt != a.sample(task, 2048, 6).prompt
    assert a.samples("vt", 2048, 2, start=4) == [a.sample("vt", 2048, 4), a.sample("vt", 2048, 5)]


def test_cwe_is_deterministic_across_generators(qwen_tokenizer, qwen_generator):
    again = RulerGenerator(qwen_tokenizer, seed=qwen_generator.seed)
    assert again.sample("cwe", 2048, 1) == qwen_generator.sample("cwe", 2048, 1)
    assert again.sample("cwe", 2048, 1).prompt != qwen_generator.sample("cwe", 2048, 2).prompt


def test_chat_template_wraps_the_task_and_precedes_the_answer_prefix(qwen_tokenizer):
    gen = RulerGenerator(qwen_tokenizer, template="chatml")
    s = gen.sample("niah_single_1", 1024, 0)
    assert s.prompt.startswith("<|im_start|>user\nA special magic number")
    assert "<|im_end|>\n<|im_start|>assistant\n The special magic number for" in s.prompt
    _within_one_percent(s)


def test_in_context_examples_sit_before_the_task(qwen_generator):
    vt = qwen_generator.sample("vt", 4096, 0)
    assert vt.prompt.count("Memorize and track the chain(s)") == 2
    example = vt.prompt[: vt.prompt.rindex("Memorize and track")]
    assert re.search(r"they are: ([A-Z]{3} ){4}[A-Z]{3}\n\n$", example)
    cwe = qwen_generator.sample("cwe", 4096, 0)
    assert cwe.prompt.count("Below is a numbered list of words") == 2
    assert len(re.findall(r"\b(?:" + "|".join(cwe.references) + r")\b", cwe.prompt)) >= 30 * 10


def test_a_custom_tokenizer_with_a_bos_token_is_counted_whole():
    class WithBos(RegexTokenizer):
        def encode(self, text):
            return [0] + super().encode(text)

    tok = WithBos()
    s = RulerGenerator(tok).sample("niah_single_2", 2048, 0)
    assert s.prompt_tokens == len(tok.encode(s.prompt))
    _within_one_percent(s)


def test_shakespeare_haystack(qwen_tokenizer):
    s = RulerGenerator(qwen_tokenizer, corpus="shakespeare").sample("niah_single_2", 2048, 0)
    _within_one_percent(s)
    assert "**" not in s.prompt and "[" not in s.prompt


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: NiahConfig(haystack="hay"), "haystack"),
        (lambda: NiahConfig(key_type="colors"), "key_type"),
        (lambda: NiahConfig(num_keys=1, num_queries=2), "num_queries"),
        (lambda: NiahConfig(num_values=0), "num_values"),
        (lambda: NiahConfig(depths=(0.5, 0.2)), "depths"),
        (lambda: NiahConfig(depths=(1.5,)), "depths"),
        (lambda: VariableTrackingConfig(num_hops=0), "num_hops"),
        (lambda: VariableTrackingConfig(haystack="needle"), "haystack"),
        (lambda: CommonWordsConfig(freq_common=3, freq_uncommon=3), "freq_uncommon"),
        (lambda: FreqWordsConfig(alpha=1.0), "alpha"),
        (lambda: FreqWordsConfig(vocab_size=3), "vocab_size"),
    ],
)
def test_bad_configs_are_rejected(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_requests_are_rejected():
    gen = RulerGenerator(RegexTokenizer())
    with pytest.raises(ValueError, match="qa_1.*SQuAD"):
        gen.sample("qa_1", 4096, 0)
    with pytest.raises(ValueError, match="task must be one of"):
        gen.sample("niah", 4096, 0)
    with pytest.raises(ValueError, match="target_length"):
        gen.sample("niah_single_1", 128, 0)
    with pytest.raises(ValueError, match="cannot fit"):
        gen.sample("niah_single_1", 160, 0)
    with pytest.raises(ValueError, match="template"):
        RulerGenerator(RegexTokenizer(), template="llama")
    with pytest.raises(ValueError, match="corpus"):
        RulerGenerator(RegexTokenizer(), corpus="essays")
    assert set(ALL_TASKS) == set(TASKS) | set(MISSING_TASKS) and len(ALL_TASKS) == 13
