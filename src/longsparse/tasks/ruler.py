"""RULER's synthetic long-context tasks, generated at a target length in the model's tokenizer.

Semantics follow NVIDIA's RULER (Hsieh et al., 2024; ``scripts/synthetic.yaml`` and ``scripts/data/synthetic/*.py``
in github.com/NVIDIA/RULER), re-implemented here. The 13 RULER tasks and what we generate:

==================  ======================  ==========================================================
task                family                  configuration (RULER's)
==================  ======================  ==========================================================
niah_single_1       niah                    noise haystack, word key, number value
niah_single_2       niah                    essay haystack, word key, number value
niah_single_3       niah                    essay haystack, word key, uuid value
niah_multikey_1     niah                    essay haystack, 4 word keys (one asked), number values
niah_multikey_2     niah                    haystack of distractor needles, word keys, number values
niah_multikey_3     niah                    haystack of distractor needles, uuid keys, uuid values
niah_multivalue     niah                    essay haystack, 1 word key with 4 number values
niah_multiquery     niah                    essay haystack, 4 word keys, all 4 asked
vt                  variable_tracking       noise haystack, 1 chain of 4 hops, one in-context example
cwe                 common_words_extraction 10 common words x30 among others x3 (x6 / x1 below 4K)
fwe                 freq_words_extraction   coded words with Zipf frequencies (alpha 2), top 3 asked
qa_1, qa_2          qa                      MISSING: need SQuAD / HotpotQA, not available offline
==================  ======================  ==========================================================

Length. As in RULER, a sample of target length L has a prompt of at most ``L - max_new_tokens`` tokens (the task's
generation budget counts towards L). The prompt is the task text, wrapped in the chat template, followed by the
task's answer prefix; RULER feeds ``input + answer_prefix`` to the model the same way. We fill the haystack so that
the prompt lands within a few tokens of that bound (see ``tokens.fit_to_budget``); ``Sample.length`` is the measured
prompt size plus ``max_new_tokens``.

Where we differ from RULER, and why:

* Essay haystack: public-domain text from installed packages (``haystack.py``), starting at a clause chosen per
  sample (RULER always starts at the first essay), so samples do not share one haystack.
* Depth: a needle's depth is the fraction of haystack tokens before it. Requested depths come from RULER's grid
  (40 integers ``round(linspace(0, 100, 40))`` percent, drawn without replacement) for every haystack type (RULER
  draws uniform positions for noise and needle haystacks), and a needle goes to the allowed boundary closest in
  tokens: sentence or clause starts in essays (after ``. ? ! ; :``; RULER uses sentence starts), any noise sentence
  or line elsewhere. ``Sample.depths`` holds the depths achieved.
* Noise haystack granularity: single sentences (five to a line) instead of whole five-sentence passages, and
  the needle haystack's distractor lines are chosen by size (not only counted), so short targets can be met within
  1%; ``fwe`` fills its last few tokens with more of its noise word ``...``.
* Word keys: our own adjective and noun lists (``words.py``); common words for ``cwe``: the lowercase vocabulary of the
  two corpora (RULER uses the ``wonderwords`` lists). Keys, values and variable chains' values are distinct within a
  sample.
* In-context examples (``vt``, ``cwe``) sit inside the chat template, before the task, as in RULER.
"""

from __future__ import annotations

import dataclasses
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .haystack import CORPORA, NOISE_SENTENCES, Corpus, load_corpus
from .tokens import TokenCounter, Tokenizer, fit_to_budget
from .words import ADJECTIVES, NOUNS

# RULER's needle depths: round(linspace(0, 100, 40)) percent.
DEPTHS: tuple[float, ...] = tuple(float(d) / 100 for d in np.round(np.linspace(0, 100, num=40)).astype(int))

CHAT_TEMPLATES: dict[str, str] = {
    "base": "{task}",
    "chatml": "<|im_start|>user\n{task}<|im_end|>\n<|im_start|>assistant\n",
}

NEEDLE_KINDS = ("words", "numbers", "uuids")
HAYSTACKS = ("noise", "essay", "needle")
_NOISE_SENTENCES_PER_LINE = len(NOISE_SENTENCES)
# RULER switches cwe to lighter repetition (and a smaller in-context example) below this target length.
CWE_SHORT_CONTEXT = 4096
# RULER builds the vt in-context example at this length (its own prompt, no generation budget).
VT_EXAMPLE_TOKENS = 500


@dataclass(frozen=True)
class NiahConfig:
    """Needle in a haystack: ``num_keys`` keys with ``num_values`` values each, ``num_queries`` keys asked.

    ``depths``: one depth in [0, 1] per needle (``num_keys * num_values`` of them), or None for RULER's grid.
    """

    haystack: str = "essay"
    key_type: str = "words"
    value_type: str = "numbers"
    num_keys: int = 1
    num_values: int = 1
    num_queries: int = 1
    depths: tuple[float, ...] | None = None

    family: ClassVar[str] = "niah"
    max_new_tokens: ClassVar[int] = 128

    def __post_init__(self):
        if self.haystack not in HAYSTACKS:
            raise ValueError(f"haystack must be one of {HAYSTACKS}, got {self.haystack!r}")
        for name in ("key_type", "value_type"):
            if getattr(self, name) not in NEEDLE_KINDS:
                raise ValueError(f"{name} must be one of {NEEDLE_KINDS}, got {getattr(self, name)!r}")
        for name in ("num_keys", "num_values", "num_queries"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an int >= 1, got {getattr(self, name)!r}")
        if self.num_queries > self.num_keys:
            raise ValueError(f"num_queries ({self.num_queries}) must be <= num_keys ({self.num_keys})")
        if self.depths is not None:
            n = self.num_keys * self.num_values
            if len(self.depths) != n or not all(0.0 <= d <= 1.0 for d in self.depths):
                raise ValueError(f"depths must be {n} values in [0, 1] (one per needle), got {self.depths!r}")


@dataclass(frozen=True)
class VariableTrackingConfig:
    """Variable tracking: ``num_chains`` chains ``VAR A = 12345``, ``VAR B = VAR A``, ... of ``num_hops`` hops."""

    num_chains: int = 1
    num_hops: int = 4
    haystack: str = "noise"
    in_context_example: bool = True

    family: ClassVar[str] = "variable_tracking"
    max_new_tokens: ClassVar[int] = 30

    def __post_init__(self):
        if self.num_chains < 1 or self.num_hops < 1:
            raise ValueError(f"num_chains and num_hops must be >= 1, got {self.num_chains}, {self.num_hops}")
        if self.haystack not in ("noise", "essay"):
            raise ValueError(f"haystack must be 'noise' or 'essay' for variable tracking, got {self.haystack!r}")


@dataclass(frozen=True)
class CommonWordsConfig:
    """Common words extraction: ``num_common`` words repeated ``freq_common`` times among words repeated
    ``freq_uncommon`` times (6 and 1 below 4K, as in RULER), numbered; the common ones are asked."""

    freq_common: int = 30
    freq_uncommon: int = 3
    num_common: int = 10
    num_examples: int = 1

    family: ClassVar[str] = "common_words_extraction"
    max_new_tokens: ClassVar[int] = 120

    def __post_init__(self):
        if not 1 <= self.freq_uncommon < self.freq_common:
            raise ValueError(f"need 1 <= freq_uncommon < freq_common, got {self.freq_uncommon}, {self.freq_common}")
        if self.num_common < 1 or self.num_examples < 0:
            raise ValueError(f"need num_common >= 1 and num_examples >= 0, got {self.num_common}, {self.num_examples}")


@dataclass(frozen=True)
class FreqWordsConfig:
    """Frequent words extraction: random coded words with counts ``floor(n k^-alpha / zeta(alpha))`` by rank k; the
    top rank is ``...`` (noise) and ranks 2-4 are asked. ``vocab_size`` None means RULER's (prompt budget) // 50."""

    alpha: float = 2.0
    word_length: int = 6
    vocab_size: int | None = None

    family: ClassVar[str] = "freq_words_extraction"
    max_new_tokens: ClassVar[int] = 50

    def __post_init__(self):
        if not self.alpha > 1.0:
            raise ValueError(f"alpha must be > 1 (the zeta distribution needs it), got {self.alpha}")
        if self.word_length < 3:
            raise ValueError(f"word_length must be >= 3, got {self.word_length}")
        if self.vocab_size is not None and self.vocab_size < 5:
            raise ValueError(f"vocab_size must be >= 5, got {self.vocab_size}")


TaskConfig = NiahConfig | VariableTrackingConfig | CommonWordsConfig | FreqWordsConfig

TASKS: dict[str, TaskConfig] = {
    "niah_single_1": NiahConfig(haystack="noise"),
    "niah_single_2": NiahConfig(haystack="essay"),
    "niah_single_3": NiahConfig(haystack="essay", value_type="uuids"),
    "niah_multikey_1": NiahConfig(haystack="essay", num_keys=4),
    "niah_multikey_2": NiahConfig(haystack="needle"),
    "niah_multikey_3": NiahConfig(haystack="needle", key_type="uuids", value_type="uuids"),
    "niah_multivalue": NiahConfig(haystack="essay", num_values=4),
    "niah_multiquery": NiahConfig(haystack="essay", num_keys=4, num_queries=4),
    "vt": VariableTrackingConfig(),
    "cwe": CommonWordsConfig(),
    "fwe": FreqWordsConfig(),
}

MISSING_TASKS: dict[str, str] = {
    "qa_1": "needs SQuAD v2 (RULER downloads it); no installed package ships it and this project works offline",
    "qa_2": "needs HotpotQA (RULER downloads it); no installed package ships it and this project works offline",
}

ALL_TASKS: tuple[str, ...] = (*TASKS, *MISSING_TASKS)


@dataclass(frozen=True)
class Sample:
    """One prompt with its references.

    ``prompt``: the full text given to the model (chat template and answer prefix included); ``references``: the
    strings a correct answer contains; ``prompt_tokens``: ``len(tokenizer.encode(prompt))``; ``depths``: achieved
    depth of each inserted needle or chain line (fraction of haystack tokens before it), in prompt order.
    """

    task: str
    index: int
    seed: int
    target_length: int
    prompt: str
    references: tuple[str, ...]
    prompt_tokens: int
    max_new_tokens: int
    depths: tuple[float, ...] = ()

    @property
    def length(self) -> int:
        """RULER's length: prompt tokens plus the generation budget (at most ``target_length``)."""
        return self.prompt_tokens + self.max_new_tokens

    @property
    def id(self) -> str:
        return f"{self.task}/{self.target_length}/{self.index}"

    def as_dict(self) -> dict:
        """The fields as JSON values (:meth:`from_dict` reads them back), to carry generated samples elsewhere."""
        d = dataclasses.asdict(self)
        d["references"], d["depths"] = list(self.references), list(self.depths)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Sample:
        return cls(**{**d, "references": tuple(d["references"]), "depths": tuple(d["depths"])})


class RulerGenerator:
    """Generates RULER samples for one tokenizer; deterministic in (seed, task, target length, index).

    ``template``: a name in ``CHAT_TEMPLATES`` or a string with one ``{task}`` field. ``corpus``: the essay haystack,
    one of ``haystack.CORPORA`` or a loaded ``Corpus``. Corpora and token counts are loaded / memoised per instance.
    """

    def __init__(self, tokenizer: Tokenizer, *, seed: int = 42, template: str = "base", corpus: str | Corpus = "kjv"):
        self.counter = TokenCounter(tokenizer)
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self.seed = seed
        self.template = CHAT_TEMPLATES.get(template, template)
        if self.template.count("{task}") != 1:
            raise ValueError(f"template must be one of {list(CHAT_TEMPLATES)} or contain '{{task}}' once: {template!r}")
        if isinstance(corpus, str) and corpus not in CORPORA:
            raise ValueError(f"corpus must be one of {CORPORA} or a Corpus, got {corpus!r}")
        self._corpus = corpus if isinstance(corpus, Corpus) else None
        self._corpus_name = corpus.name if isinstance(corpus, Corpus) else corpus
        self._word_pool: list[str] | None = None

    @property
    def corpus(self) -> Corpus:
        if self._corpus is None:
            self._corpus = load_corpus(self._corpus_name)
        return self._corpus

    def word_pool(self) -> list[str]:
        """Words for ``cwe``: the sorted lowercase vocabulary of all corpora."""
        if self._word_pool is None:
            vocab = set(self.corpus.vocabulary())
            for name in CORPORA:
                if name != self.corpus.name:
                    vocab.update(load_corpus(name).vocabulary())
            self._word_pool = sorted(vocab)
        return self._word_pool

    def samples(self, task: str, target_length: int, num_samples: int, *, start: int = 0) -> list[Sample]:
        """Samples ``start .. start + num_samples - 1`` of ``task`` at ``target_length`` tokens."""
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        return [self.sample(task, target_length, i) for i in range(start, start + num_samples)]

    def sample(self, task: str, target_length: int, index: int, *, config: TaskConfig | None = None) -> Sample:
        """Sample ``index`` of ``task``; ``config`` overrides the task's RULER configuration (e.g. fixed depths)."""
        if task in MISSING_TASKS:
            raise ValueError(f"task {task!r} is not available: {MISSING_TASKS[task]}")
        if config is None:
            if task not in TASKS:
                raise ValueError(f"task must be one of {list(TASKS)}, got {task!r}")
            config = TASKS[task]
        if not isinstance(target_length, int) or target_length <= config.max_new_tokens:
            raise ValueError(
                f"target_length must be an int > {config.max_new_tokens} ({task}'s budget), got {target_length!r}"
            )
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        rng = np.random.default_rng([self.seed, zlib.crc32(task.encode()), target_length, index])
        budget = target_length - config.max_new_tokens
        make = {
            "niah": self._niah,
            "variable_tracking": self._variable_tracking,
            "common_words_extraction": self._common_words,
            "freq_words_extraction": self._freq_words,
        }[config.family]
        prompt, references, tokens, depths = make(config, rng, budget, target_length)
        refs = tuple(references)
        return Sample(task, index, self.seed, target_length, prompt, refs, tokens, config.max_new_tokens, depths)

    def _wrap(self, task_text: str, answer_prefix: str) -> str:
        return self.template.replace("{task}", task_text) + answer_prefix

    def _niah(self, cfg: NiahConfig, rng: np.random.Generator, budget: int, target_length: int):
        n_needles = cfg.num_keys * cfg.num_values
        keys = _draw_distinct(cfg.key_type, cfg.num_keys, rng)
        values = _draw_distinct(cfg.value_type, n_needles, rng)
        needles = [
            _needle(cfg.value_type, keys[k], values[k * cfg.num_values + v])
            for k in range(cfg.num_keys)
            for v in range(cfg.num_values)
        ]
        needles = [needles[i] for i in rng.permutation(n_needles)]
        depths = cfg.depths if cfg.depths is not None else tuple(sorted(rng.choice(DEPTHS, n_needles, replace=False)))
        asked = rng.choice(cfg.num_keys, cfg.num_queries, replace=False)
        query = _join_query([keys[k] for k in asked])
        references = [values[k * cfg.num_values + v] for k in asked for v in range(cfg.num_values)]

        if cfg.num_queries * cfg.num_values == 1:
            kind = cfg.value_type[:-1]
            head = f"A special magic {kind} is hidden within the following text. Make sure to memorize it. "
            head += f"I will quiz you about the {kind} afterwards.\n"
            tail = f"\nWhat is the special magic {kind} for {query} mentioned in the provided text?"
            prefix = f" The special magic {kind} for {query} mentioned in the provided text is"
        else:
            kind = cfg.value_type
            head = f"Some special magic {kind} are hidden within the following text. Make sure to memorize it. "
            head += f"I will quiz you about the {kind} afterwards.\n"
            tail = f"\nWhat are all the special magic {kind} for {query} mentioned in the provided text?"
            prefix = f" The special magic {kind} for {query} mentioned in the provided text are"

        if cfg.haystack == "needle":
            units = self._distractor_units(cfg, rng, budget, exclude=set(keys))
        else:
            units = self._haystack_units(cfg.haystack, rng, budget)
        inserted = [(d, [n]) for d, n in zip(depths, needles)]
        build = lambda ctx: self._wrap(head + ctx + tail, prefix)  # noqa: E731
        return self._fit_haystack(units, inserted, build, budget, references)

    def _variable_tracking(self, cfg: VariableTrackingConfig, rng: np.random.Generator, budget: int, target_length):
        example = ""
        if cfg.in_context_example:
            ex_prompt, ex_names, _, _ = self._vt_task(cfg, rng, VT_EXAMPLE_TOKENS, name_length=3, wrap=False)
            example = ex_prompt + " ".join(ex_names) + "\n\n"  # the answer prefix ends with a space
        return self._vt_task(cfg, rng, budget, name_length=5, wrap=True, example=example)

    def _vt_task(self, cfg, rng, budget: int, *, name_length: int, wrap: bool, example: str = ""):
        names = _distinct(
            lambda: "".join(chr(65 + c) for c in rng.integers(0, 26, name_length)), (cfg.num_hops + 1) * cfg.num_chains
        )
        chain_values = _distinct(lambda: str(rng.integers(10000, 100000)), cfg.num_chains)
        inserted: list[tuple[float, list[str]]] = []
        end = "." if cfg.haystack == "essay" else ""
        for c in range(cfg.num_chains):
            chain = names[c * (cfg.num_hops + 1) : (c + 1) * (cfg.num_hops + 1)]
            lines = [f"VAR {chain[0]} = {chain_values[c]}{end}"]
            lines += [f"VAR {chain[j + 1]} = VAR {chain[j]}{end}" for j in range(cfg.num_hops)]
            inserted += [(float(d), [line]) for d, line in zip(np.sort(rng.random(len(lines))), lines)]
        inserted.sort(key=lambda item: item[0])  # stable: a chain keeps its order where depths tie
        value, answer = chain_values[0], names[: cfg.num_hops + 1]
        head = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
        tail = f"\nQuestion: Find all variables that are assigned the value {value} in the text above."
        prefix = (
            " Answer: According to the chain(s) of variable assignment in the text above, "
            f"{cfg.num_hops + 1} variables are assigned the value {value}, they are: "
        )

        def build(ctx: str) -> str:
            text = example + head + ctx + tail
            return self._wrap(text, prefix) if wrap else text + prefix

        units = self._haystack_units(cfg.haystack, rng, budget)
        return self._fit_haystack(units, inserted, build, budget, answer)

    def _common_words(self, cfg: CommonWordsConfig, rng: np.random.Generator, budget: int, target_length: int):
        short = target_length < CWE_SHORT_CONTEXT
        freq_c, freq_u = (6, 1) if short else (cfg.freq_common, cfg.freq_uncommon)
        ex_words, ex_freq_c, ex_freq_u = (20, 3, 1) if short else (40, 10, 3)
        pool = self.word_pool()
        order = rng.permutation(len(pool))
        n_examples = ex_words * cfg.num_examples
        if len(pool) < cfg.num_common + n_examples + 1:
            raise ValueError(f"the word pool ({len(pool)} words) is too small for num_common={cfg.num_common}")
        common = [pool[i] for i in order[: cfg.num_common]]
        example_words = [pool[i] for i in order[len(order) - n_examples :]]
        uncommon = [pool[i] for i in order[cfg.num_common : len(order) - n_examples]]
        shuffle_seed = int(rng.integers(2**63))
        head = (
            "Below is a numbered list of words. In these words, some appear more often than others. "
            "Memorize the ones that appear most often.\n"
        )
        tail = f"\nQuestion: What are the {cfg.num_common} most common words in the above list?"
        prefix = f" Answer: The top {cfg.num_common} words that appear most often in the list are:"

        def numbered(words: Sequence[str]) -> str:
            return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))

        def listing(top: list[str], rest: list[str], fc: int, fu: int, seed: int) -> str:
            words = top * fc + rest * fu
            return numbered([words[i] for i in np.random.default_rng(seed).permutation(len(words))])

        examples = []
        for e in range(cfg.num_examples):
            ws = example_words[e * ex_words : (e + 1) * ex_words]
            ctx = listing(ws[: cfg.num_common], ws[cfg.num_common :], ex_freq_c, ex_freq_u, shuffle_seed + 1 + e)
            examples.append(head + ctx + tail + prefix + " " + numbered(ws[: cfg.num_common]))
        example_text = "".join(e + "\n" for e in examples)

        def build(n: int) -> str:
            ctx = listing(common, uncommon[:n], freq_c, freq_u, shuffle_seed)
            return self._wrap(example_text + head + ctx + tail, prefix)

        word_cost = np.concatenate([[0], np.cumsum(freq_u * self.counter.pieces(" " + w for w in uncommon))])
        number_cost = self._numbering_cost()
        first = cfg.num_common * freq_c
        base = self.counter.count(build(0))

        def estimate(n: int) -> int:
            return base + int(word_cost[n]) + number_cost(first + freq_u * n) - number_cost(first)

        if estimate(len(uncommon)) <= budget:
            raise ValueError(f"the word pool ({len(pool)} words) is too small for {target_length} tokens")
        n, tokens = fit_to_budget(estimate, lambda n: self.counter.count(build(n)), budget, len(uncommon))
        return build(n), common, tokens, ()

    def _numbering_cost(self) -> Callable[[int], int]:
        """Estimated tokens of the list numbers ``" 1." .. " m."`` as a function of m (depends on digit counts)."""
        per_digits = [self.counter.piece(f" {10 ** (d - 1)}.") for d in range(1, 12)]

        def cost(m: int) -> int:
            total, d = 0, 1
            while 10 ** (d - 1) <= m:
                total += (min(m, 10**d - 1) - 10 ** (d - 1) + 1) * per_digits[d - 1]
                d += 1
            return total

        return cost

    def _freq_words(self, cfg: FreqWordsConfig, rng: np.random.Generator, budget: int, target_length: int):
        size = cfg.vocab_size if cfg.vocab_size is not None else max(budget // 50, 5)
        vocab = _distinct(lambda: "".join(chr(97 + c) for c in rng.integers(0, 26, cfg.word_length)), size)
        vocab[0] = "..."
        weights = np.arange(1, size + 1, dtype=np.float64) ** -cfg.alpha / _zeta(cfg.alpha)
        word_tokens = self.counter.pieces(" " + w for w in vocab)
        shuffle_seed = int(rng.integers(2**63))
        head = (
            "Read the following coded text and track the frequency of each coded word. "
            "Find the three most frequently appeared coded words. "
        )
        tail = (
            "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
            "What are the three most frequently appeared words in the above coded text?"
        )
        prefix = " Answer: According to the coded text above, the three most frequently appeared words are:"

        def counts(n: int) -> np.ndarray:
            return np.floor(n * weights).astype(np.int64)

        def build(n: int, extra_noise: int = 0) -> str:
            c = counts(n)
            c[0] += extra_noise
            words = np.repeat(np.arange(size), c)
            words = words[np.random.default_rng(shuffle_seed).permutation(len(words))]
            return self._wrap(head + " ".join(vocab[i] for i in words) + tail, prefix)

        base = self.counter.count(build(0))

        def estimate(n: int) -> int:
            return base + int(counts(n) @ word_tokens)

        n_max = 2 * budget + 64
        while estimate(n_max) <= budget:
            n_max *= 2
        n, tokens = fit_to_budget(estimate, lambda n: self.counter.count(build(n)), budget, n_max)
        # One more word can add several at once (many floors step together): fill what is left with the noise word,
        # which is already the most frequent and is not asked, so the answer does not change.
        fitted = tokens
        fill, tokens = fit_to_budget(
            lambda e: fitted + e * int(word_tokens[0]),
            lambda e: self.counter.count(build(n, e)),
            budget,
            (budget - tokens) // max(int(word_tokens[0]), 1) + 1,
        )
        c = counts(n)
        if not c[1] > c[2] > c[3] > c[4]:
            raise ValueError(f"{target_length} tokens are too few for distinct top-3 word counts in fwe")
        return build(n, fill), vocab[1:4], tokens, ()

    def _haystack_units(self, kind: str, rng: np.random.Generator, budget: int) -> _Units:
        """Noise sentences or essay words, enough to exceed ``budget`` tokens (every unit has at least one)."""
        count = budget + 1
        if kind == "noise":
            texts = [NOISE_SENTENCES[i % _NOISE_SENTENCES_PER_LINE] for i in range(count)]
            pieces = [(" " if i % _NOISE_SENTENCES_PER_LINE else "\n") + t for i, t in enumerate(texts)]
            return _Units(texts, self.counter.pieces(pieces), None, _render_noise)
        corpus = self.corpus
        starts = np.flatnonzero(corpus.clause_starts)
        first = int(starts[rng.integers(len(starts))])
        idx = (first + np.arange(count)) % len(corpus.words)
        texts = [corpus.words[i] for i in idx]
        allowed = np.append(corpus.clause_starts[idx], True)
        return _Units(texts, self.counter.pieces(" " + w for w in texts), allowed, _render_words)

    def _distractor_units(self, cfg: NiahConfig, rng: np.random.Generator, budget: int, exclude: set[str]) -> _Units:
        """RULER's "needle" haystack: needles with random keys and values that are never asked.

        Lines are drawn 64 at a time until they hold 50% more tokens than ``budget`` and number at least 256: the
        spares give ``rebalance`` lines of every size to choose from. Encoding each line is the expensive part, so
        the pool is sized by what it holds, not by a guess."""
        texts: list[str] = []
        tokens: list[np.ndarray] = []
        total = 0
        while total <= 1.5 * budget or len(texts) < 256:
            keys = _draw_distinct(cfg.key_type, 64, rng, exclude=exclude, unique=False)
            values = _draw_distinct(cfg.value_type, 64, rng, unique=False)
            chunk = [_needle(cfg.value_type, k, v) for k, v in zip(keys, values)]
            tokens.append(self.counter.pieces("\n" + t for t in chunk))
            texts += chunk
            total += int(tokens[-1].sum())
        return _Units(texts, np.concatenate(tokens), None, _render_lines, swappable=True)

    def _fit_haystack(self, units: _Units, inserted, build_prompt, budget: int, references):
        """Fit ``units`` plus the ``inserted`` (depth, texts) pieces into ``budget``; returns the make() tuple."""
        inserted = sorted(inserted, key=lambda item: item[0])  # stable, so achieved depths come in prompt order
        requested = [d for d, _ in inserted]

        def prompt(n: int) -> tuple[str, tuple[float, ...]]:
            where = units.place(n, requested)
            inserts: dict[int, list[str]] = {}
            for b, (_, texts) in zip(where, inserted):
                inserts.setdefault(b, []).extend(texts)
            total = units.cum[n]
            achieved = tuple(float(units.cum[b] / total) if total else 0.0 for b in where)
            return build_prompt(units.render(units.texts[:n], inserts)), achieved

        base = self.counter.count(prompt(0)[0])

        def fit() -> tuple[int, int]:
            return fit_to_budget(
                lambda n: base + int(units.cum[n]), lambda n: self.counter.count(prompt(n)[0]), budget, len(units.texts)
            )

        n, tokens = fit()
        if units.swappable and tokens < budget:
            # Whole distractor lines (20-90 tokens) are too coarse for short targets: choose which lines, not only
            # how many, so their sizes add up to the room left (one more line if shorter ones fit, else this many).
            room = budget - (tokens - int(units.cum[n]))
            if not units.rebalance(n + 1, room):
                units.rebalance(n, room)
            n, tokens = fit()
        text, achieved = prompt(n)
        return text, references, tokens, achieved


@dataclass
class _Units:
    """Haystack units (words, sentences or lines) with estimated token counts.

    ``allowed[b]`` (length ``len(texts) + 1``) is True where an insertion may go before unit ``b``; None allows all.
    ``render(texts, inserts)`` joins units with ``inserts[b]`` placed before unit ``b``.
    """

    texts: list[str]
    tokens: np.ndarray
    allowed: np.ndarray | None
    render: Callable[[list[str], dict[int, list[str]]], str]
    swappable: bool = False
    cum: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        self.cum = np.concatenate([[0], np.cumsum(self.tokens)])

    def place(self, n: int, depths: Sequence[float]) -> list[int]:
        """For each depth, the allowed boundary in ``0..n`` whose share of the first n units' tokens is closest."""
        if self.allowed is None:
            candidates = np.arange(n + 1)
        else:
            candidates = np.append(np.flatnonzero(self.allowed[:n]), n)
        at = self.cum[candidates]
        out = []
        for d in depths:
            target = d * self.cum[n]
            j = int(np.searchsorted(at, target))
            if j == len(at) or (j > 0 and target - at[j - 1] <= at[j] - target):
                j -= 1
            out.append(int(candidates[j]))
        return out

    def rebalance(self, n: int, room: int) -> bool:
        """Reorder units so the first ``n`` add up to at most ``room`` estimated tokens, as close to it as swaps of
        single units get; False (order possibly changed) if even the ``n`` shortest units exceed ``room``."""
        if n > len(self.texts):
            return False
        used = self.tokens[:n]
        while used.sum() > room:
            i, j = int(np.argmax(used)), n + int(np.argmin(self.tokens[n:]))
            if self.tokens[j] >= self.tokens[i]:
                self._recount()
                return False
            self._swap(i, j)
        self._top_up(n, int(room - used.sum()))
        self._recount()
        return True

    def _swap(self, i: int, j: int) -> None:
        self.texts[i], self.texts[j] = self.texts[j], self.texts[i]
        self.tokens[[i, j]] = self.tokens[[j, i]]

    def _recount(self) -> None:
        self.cum = np.concatenate([[0], np.cumsum(self.tokens)])

    def _top_up(self, n: int, deficit: int) -> None:
        """Swap units among the first n for longer unused ones, adding at most ``deficit`` estimated tokens."""
        while deficit > 0:
            used: dict[int, int] = {}
            for i in range(n):
                used.setdefault(int(self.tokens[i]), i)
            spare: dict[int, int] = {}
            for j in range(n, len(self.texts)):
                spare.setdefault(int(self.tokens[j]), j)
            swap = next(
                ((used[c], spare[c + d], d) for d in range(deficit, 0, -1) for c in used if c + d in spare), None
            )
            if swap is None:
                break
            i, j, d = swap
            self._swap(i, j)
            deficit -= d


def _segments(texts: list[str], inserts: dict[int, list[str]]) -> list[str]:
    pieces: list[str] = []
    start = 0
    for b in sorted(inserts):
        pieces.extend(texts[start:b])
        pieces.extend(inserts[b])
        start = b
    pieces.extend(texts[start:])
    return pieces


def _render_words(texts: list[str], inserts: dict[int, list[str]]) -> str:
    return " ".join(_segments(texts, inserts))


def _render_lines(texts: list[str], inserts: dict[int, list[str]]) -> str:
    return "\n".join(_segments(texts, inserts))


def _render_noise(texts: list[str], inserts: dict[int, list[str]]) -> str:
    """Noise sentences, five to a line as in RULER's repeated passage; inserted texts get lines of their own."""
    lines: list[str] = []
    current: list[str] = []
    for i in range(len(texts) + 1):
        if i in inserts or i % _NOISE_SENTENCES_PER_LINE == 0 or i == len(texts):
            if current:
                lines.append(" ".join(current))
                current = []
            lines.extend(inserts.get(i, ()))
        if i < len(texts):
            current.append(texts[i])
    return "\n".join(lines)


def _needle(kind: str, key: str, value: str) -> str:
    return f"One of the special magic {kind} for {key} is: {value}."


def _join_query(keys: list[str]) -> str:
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + ", and " + keys[-1]


def _random_needle(kind: str, rng: np.random.Generator) -> str:
    if kind == "words":
        return f"{ADJECTIVES[rng.integers(len(ADJECTIVES))]}-{NOUNS[rng.integers(len(NOUNS))]}"
    if kind == "numbers":
        return str(rng.integers(10**6, 10**7))
    return str(uuid.UUID(bytes=rng.bytes(16), version=4))


def _draw_distinct(
    kind: str, count: int, rng: np.random.Generator, *, exclude: set[str] = frozenset(), unique: bool = True
) -> list[str]:
    """``count`` random keys or values of ``kind`` (RULER's formats), none in ``exclude``, distinct if ``unique``."""
    if not unique:
        out = []
        while len(out) < count:
            x = _random_needle(kind, rng)
            if x not in exclude:
                out.append(x)
        return out
    return _distinct(lambda: _random_needle(kind, rng), count, exclude)


def _distinct(draw: Callable[[], str], count: int, exclude: set[str] = frozenset()) -> list[str]:
    out: list[str] = []
    seen = set(exclude)
    for _ in range(100 * count + 100):
        if len(out) == count:
            return out
        x = draw()
        if x not in seen:
            seen.add(x)
            out.append(x)
    raise ValueError(f"could not draw {count} distinct values")


def _zeta(alpha: float, terms: int = 10_000) -> float:
    """Riemann zeta(alpha) for alpha > 1: a partial sum plus its Euler-Maclaurin tail (error ~ terms^-(alpha+1))."""
    k = np.arange(1, terms + 1, dtype=np.float64)
    return float(np.sum(k**-alpha) + terms ** (1 - alpha) / (alpha - 1) - 0.5 * terms**-alpha)
