"""Training the small Qwen3.5 hybrid (docs/hybrid.md): resumable, time-limited runs in one run folder.

A run folder holds ``run.json`` (the model, data and training configs; a resumed run must be given the same),
``tokenizer.json``, ``checkpoint.pt`` (step, float32 weights, AdamW state; written every ``checkpoint_every`` steps
and whenever the run stops), ``train_log.jsonl`` (one JSON object per logged step or held-out evaluation) and
``model/``, the Hugging Face export (``config.json``, ``model.safetensors``, tokenizer files, the training log) that
``longsparse.load_model`` / ``longsparse.LLM`` load. Calling :func:`train` again on the folder continues where the
last call stopped and takes the same steps an uninterrupted run would: batches are a function of the step number.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import shutil
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .hybrid_data import IGNORE, DataConfig, HeldOutSample, HybridDataMix, StepBatches, held_out_set
from .model import HybridModelConfig, build_model, fla_available, gdn_kernel, import_qwen35_modeling, parameter_count
from .tokenizer import eos_id, load_trained, save_for_transformers, train_bpe

RUN_FILE = "run.json"
CHECKPOINT_FILE = "checkpoint.pt"
LOG_FILE = "train_log.jsonl"
TOKENIZER_FILE = "tokenizer.json"
EXPORT_DIR = "model"


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and bookkeeping of a run.

    AdamW (``betas``, ``weight_decay`` on matrices only), learning rate warmed up linearly over ``warmup_steps`` then
    cosine-decayed to ``lr * min_lr_ratio`` at ``steps``; gradients clipped to norm ``grad_clip``. A step's rows run in
    micro-batches of about ``micro_batch_tokens`` tokens with accumulated gradients. The loss is
    ``lm_weight * (mean LM loss over text tokens) + (mean loss over answer tokens)`` of the whole step. Every
    ``eval_every`` steps the held-out set (``eval_per_task`` samples of each training task at each of ``eval_lens``) is
    scored by teacher-forced exact match: every answer token the argmax, i.e. what greedy decoding would write.
    """

    steps: int = 3600
    lr: float = 1.5e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 200
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    micro_batch_tokens: int = 32768
    lm_weight: float = 1.0
    log_every: int = 10
    checkpoint_every: int = 400
    eval_every: int = 400
    eval_per_task: int = 4
    eval_lens: tuple[int, ...] = (1024, 4096)
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        object.__setattr__(self, "eval_lens", tuple(self.eval_lens))
        for name in ("steps", "micro_batch_tokens", "log_every", "checkpoint_every", "eval_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.warmup_steps, int) or not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps must be an int in [0, steps={self.steps}), got {self.warmup_steps!r}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"need lr > 0 and min_lr_ratio in [0, 1], got {self.lr}, {self.min_lr_ratio}")
        if self.weight_decay < 0 or not self.grad_clip > 0 or self.lm_weight < 0:
            raise ValueError(
                f"need weight_decay >= 0, grad_clip > 0, lm_weight >= 0; got {self.weight_decay}, {self.grad_clip}, "
                f"{self.lm_weight}"
            )
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if self.eval_per_task < 0 or any(not isinstance(k, int) or k <= 0 for k in self.eval_lens):
            raise ValueError(f"need eval_per_task >= 0 and eval_lens > 0, got {self.eval_per_task}, {self.eval_lens}")

    def lr_at(self, step: int) -> float:
        """Learning rate of ``step`` (0-based)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(self.steps - self.warmup_steps, 1)
        cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine)


@dataclass(frozen=True)
class RunConfig:
    model: HybridModelConfig = field(default_factory=HybridModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self):
        if self.data.seq_lens[-1] > self.model.max_position_embeddings:
            raise ValueError(
                f"rows of {self.data.seq_lens[-1]} tokens exceed max_position_embeddings="
                f"{self.model.max_position_embeddings}"
            )

    def to_dict(self) -> dict:
        return {"model": asdict(self.model), "data": asdict(self.data), "train": asdict(self.train)}

    @classmethod
    def from_dict(cls, values: dict) -> RunConfig:
        """The inverse of :meth:`to_dict` (JSON lists back to tuples)."""

        def part(kind, fields: dict):
            return kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})

        return cls(part(HybridModelConfig, values["model"]), part(DataConfig, values["data"]),
                   part(TrainConfig, values["train"]))  # fmt: skip


def load_run_config(run_dir: str | Path) -> RunConfig | None:
    """The configuration a run folder was started with (its ``run.json``), or None for a folder without a run."""
    run_file = Path(run_dir) / RUN_FILE
    return RunConfig.from_dict(json.loads(run_file.read_text())["config"]) if run_file.is_file() else None


def config_differences(saved: dict, given: dict) -> list[str]:
    """``part.field: saved -> given`` for every field where two :meth:`RunConfig.to_dict` trees differ."""
    return [f"{part}.{name}: {saved[part].get(name)!r} -> {given[part].get(name)!r}"
            for part in given for name in sorted(set(saved[part]) | set(given[part]))
            if saved[part].get(name) != given[part].get(name)]  # fmt: skip


@dataclass
class RunResult:
    """Where a :func:`train` call left the run: ``step`` steps done of ``steps``."""

    step: int
    steps: int
    finished: bool
    export_dir: Path
    parameters: int


def step_loss(model, batch: dict[str, torch.Tensor], micro_rows: int, lm_weight: float, device, autocast) -> dict:
    """Forward and backward of one step's rows in micro-batches of ``micro_rows`` (gradients accumulate in ``.grad``).

    Text tokens (every loss-carrying target that is not an answer) and answer tokens are averaged separately over the
    whole step, so micro-batching does not change the loss or its gradient. Returns the loss terms as floats and the
    number of tokens of each kind; ``copy_loss`` (the mean over copy rows' loss tokens, part of the text loss) is
    logged on its own: it falls far below fresh tokens' loss once the model finds tokens in its context."""
    targets_all = batch["targets"]
    answer_all = batch["is_answer"]
    counts = targets_all != IGNORE
    n_answer = int((counts & answer_all).sum())
    n_text = int(counts.sum()) - n_answer
    copy_rows = batch["is_copy"]
    n_copy = int(counts[copy_rows].sum())
    sums = torch.zeros(3, dtype=torch.float64)
    for start in range(0, len(targets_all), micro_rows):
        ids = batch["input_ids"][start : start + micro_rows].to(device, non_blocking=True)
        targets = targets_all[start : start + micro_rows].to(device, non_blocking=True)
        is_answer = answer_all[start : start + micro_rows].to(device, non_blocking=True)
        is_copy = copy_rows[start : start + micro_rows].to(device, non_blocking=True)
        with autocast():
            logits = model(input_ids=ids, use_cache=False).logits
        losses = F.cross_entropy(
            logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="none"
        ).view_as(targets)  # 0 where the target is IGNORE
        answer_sum = losses[is_answer].sum()
        text_sum = losses[~is_answer].sum()
        loss = lm_weight * text_sum / max(n_text, 1) + answer_sum / max(n_answer, 1)
        loss.backward()
        copy_sum = losses[is_copy].sum()
        sums += torch.stack([text_sum.detach(), answer_sum.detach(), copy_sum.detach()]).double().cpu()
    lm = float(sums[0]) / max(n_text, 1)
    answer = float(sums[1]) / max(n_answer, 1)
    return {
        "loss": lm_weight * lm + answer,
        "lm_loss": lm if n_text else None,
        "answer_loss": answer if n_answer else None,
        "copy_loss": float(sums[2]) / n_copy if n_copy else None,
        "text_tokens": n_text,
        "answer_tokens": n_answer,
        "copy_targets": n_copy,
    }


@torch.no_grad()
def held_out_accuracy(model, samples: Sequence[HeldOutSample], micro_batch_tokens: int, pad_id: int, device, autocast):
    """Teacher-forced accuracy per ``"task@length"`` and per length (``"mean@length"``), in [0, 1]: exact match (every
    answer token the argmax) and, as a second dict, the share of answer tokens that are the argmax, which moves long
    before whole answers come out right."""
    was_training = model.training
    model.eval()
    hits: dict[str, list[float]] = defaultdict(list)
    token_hits: dict[str, list[float]] = defaultdict(list)
    by_len: dict[int, list[HeldOutSample]] = defaultdict(list)
    for s in samples:
        by_len[s.seq_len].append(s)
    for seq_len, group in sorted(by_len.items()):
        rows = max(1, micro_batch_tokens // seq_len)
        for start in range(0, len(group), rows):
            chunk = group[start : start + rows]
            width = max(len(s.ids) for s in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.int64)
            for i, s in enumerate(chunk):
                ids[i, : len(s.ids)] = torch.tensor(s.ids)
            with autocast():
                predicted = model(input_ids=ids.to(device), use_cache=False).logits.argmax(-1).cpu()
            for i, s in enumerate(chunk):
                answer = torch.tensor(s.ids[s.answer_from :])
                guess = predicted[i, s.answer_from - 1 : len(s.ids) - 1]
                hit = float(torch.equal(guess, answer))
                share = float((guess == answer).float().mean())
                for key in (f"{s.task}@{seq_len}", f"mean@{seq_len}"):
                    hits[key].append(hit)
                    token_hits[key].append(share)
    if was_training:
        model.train()
    return tuple({k: sum(v) / len(v) for k, v in sorted(d.items())} for d in (hits, token_hits))


def make_optimizer(model, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (projections, embeddings) and none on vectors (norms, A_log, dt_bias)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


def export(model, tokenizer, directory: Path, dtype: torch.dtype, log: Path | None = None) -> Path:
    """Write ``model`` (cast to ``dtype``), ``tokenizer`` and the training log as a Hugging Face checkpoint folder."""
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    copy.deepcopy(model).to(dtype).save_pretrained(str(tmp))
    save_for_transformers(tokenizer, tmp)
    if log is not None and log.is_file():
        shutil.copyfile(log, tmp / LOG_FILE)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)
    return directory


def _save_checkpoint(path: Path, step: int, tokens: int, model, optimizer) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"step": step, "tokens": tokens, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
    os.replace(tmp, path)


def _prepare_run(run_dir: Path, config: RunConfig, tokenizer_source: str | Path | None, texts: Callable[[], list[str]]):
    """Create or reopen ``run_dir``; returns the tokenizer. A reopened run must have been started with ``config``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    run_file = run_dir / RUN_FILE
    if run_file.is_file():
        saved = json.loads(run_file.read_text())["config"]
        differences = config_differences(saved, json.loads(json.dumps(config.to_dict())))
        if differences:
            raise ValueError(
                f"{run_dir} holds a run with another configuration ({run_file}: {'; '.join(differences)}); "
                "continue it with its own options or use a new folder"
            )
    tok_path = run_dir / TOKENIZER_FILE
    if not tok_path.is_file():
        tokenizer = load_trained(tokenizer_source) if tokenizer_source else train_bpe(texts(), config.model.vocab_size)
        tokenizer.save(str(tok_path))
    tokenizer = load_trained(tok_path)
    if tokenizer.get_vocab_size() != config.model.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.get_vocab_size()} tokens, the model config {config.model.vocab_size}"
        )
    if not run_file.is_file():
        run_file.write_text(json.dumps({"config": config.to_dict()}, indent=1) + "\n")
    return tokenizer


def _initial_weights(folder: Path, device: torch.device) -> dict:
    """``{"model": state dict, "step": int or None, "config": the export's config.json or {}}`` from a run folder's
    checkpoint or an exported model folder."""
    if (folder / CHECKPOINT_FILE).is_file():
        state = torch.load(folder / CHECKPOINT_FILE, map_location=device, weights_only=True)
        return {"model": state["model"], "step": int(state["step"]), "config": {}}
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        exported = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
        return {"model": load_file(str(folder / "model.safetensors"), device=str(device)), "step": None,
                "config": exported}  # fmt: skip
    raise FileNotFoundError(
        f"init_from={folder}: no {CHECKPOINT_FILE} (a run folder) or model.safetensors (an exported model) there"
    )


def _load_initial_weights(model, init_state: dict, model_config: HybridModelConfig) -> None:
    """Load :func:`_initial_weights` into ``model``; RuntimeError naming what does not fit (a field of an export's
    config.json that differs from ``model_config``, even where shapes agree; missing or unexpected weights)."""
    weights = init_state["model"]
    ours = asdict(model_config)
    other = {k: v for k, v in init_state["config"].items() if k in ours and v != ours[k]}
    if other:
        raise RuntimeError(", ".join(f"{k}: {v!r} there, {ours[k]!r} here" for k, v in sorted(other.items())))
    # an export leaves out tied weights (the output head is the embedding): they are loaded with their twin
    state = model.state_dict()
    present = {t.data_ptr() for k, t in state.items() if k in weights}
    tied = {k for k, t in state.items() if k not in weights and t.data_ptr() in present}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"missing {sorted(set(missing) - tied)[:4]}, unexpected {sorted(unexpected)[:4]}")


def train(
    run_dir: str | Path,
    config: RunConfig = RunConfig(),
    *,
    device: str | torch.device | None = None,
    time_limit_s: float | None = None,
    num_workers: int = 0,
    tokenizer: str | Path | None = None,
    corpora=None,
    export_dtype: torch.dtype = torch.bfloat16,
    progress: bool = True,
    stop_after: int | None = None,
    clock: Callable[[], float] = time.monotonic,
    init_from: str | Path | None = None,
) -> RunResult:
    """Train (or continue training) the run in ``run_dir`` until ``config.train.steps`` steps are done, the next step
    would pass ``time_limit_s`` (seconds from this call, the final save included: the margin is two steps at the
    call's pace, one held-out evaluation and three checkpoint saves as last measured, plus 10 s; the pace is the
    median of the last 20 step times, the call's first step, which compiles, left out), or ``stop_after`` steps are
    done in total. Saves the checkpoint and the export before returning.

    ``tokenizer``: a ``tokenizer.json`` to use for a new run (default: learn one from the corpora). ``corpora``: loaded
    :class:`~longsparse.tasks.haystack.Corpus` objects instead of the packages' texts (tests). ``num_workers``: loader
    processes building batches ahead of the model. ``init_from``: another run folder whose checkpoint's weights start
    this new run (its optimizer state and step are not taken: this run has its own schedule), and whose tokenizer it
    uses unless ``tokenizer`` names one; e.g. a copy drill (docs/hybrid.md) before the main run. An exported model
    folder (``model.safetensors`` and ``tokenizer.json``, e.g. ``runs/hybrid/model``) serves as well, with the
    export's precision (bfloat16 by default)."""
    start_time = clock()
    run_dir = Path(run_dir)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tcfg = config.train

    def corpus_texts() -> list[str]:
        from ..tasks.haystack import load_corpus
        from ..tasks.words import ADJECTIVES, NOUNS

        loaded = corpora if corpora is not None else [load_corpus(c) for c in config.data.corpora]
        return [" ".join(c.words) for c in loaded] + [" ".join(ADJECTIVES + NOUNS)]

    ckpt_path = run_dir / CHECKPOINT_FILE
    init_state = None
    if init_from is not None and not ckpt_path.is_file():
        init_state = _initial_weights(Path(init_from), device)
        tokenizer = tokenizer or Path(init_from) / TOKENIZER_FILE
    created = not run_dir.exists()
    tok = _prepare_run(run_dir, config, tokenizer, corpus_texts)
    eos = eos_id(tok)
    model = build_model(config.model, eos, device, tcfg.seed)
    optimizer = make_optimizer(model, tcfg)
    step, tokens_seen = 0, 0
    if ckpt_path.is_file():
        state = torch.load(ckpt_path, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, tokens_seen = int(state["step"]), int(state["tokens"])
    elif init_state is not None:
        try:
            _load_initial_weights(model, init_state, config.model)
        except RuntimeError as err:
            if created:  # leave no half-made run behind: the same folder can be used with the right options
                shutil.rmtree(run_dir)
            raise ValueError(f"init_from={init_from} holds weights of another model configuration: {err}") from None
    model.train()
    n_params = parameter_count(model)
    log_path = run_dir / LOG_FILE
    export_dir = run_dir / EXPORT_DIR
    last = min(tcfg.steps, stop_after) if stop_after is not None else tcfg.steps

    def autocast():
        if device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def log(record: dict) -> None:
        with log_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    modeling = import_qwen35_modeling(device.type == "cuda" and fla_available())
    log(
        {
            "event": "start",
            "step": step,
            "parameters": n_params,
            "device": str(torch.cuda.get_device_name(device) if device.type == "cuda" else device),
            "gdn_kernel": gdn_kernel(modeling),
            **({"init_from": str(init_from), "init_step": init_state["step"]} if init_state else {}),
            "torch": torch.__version__,
        }
    )
    mix = HybridDataMix(tok, config.data, corpora)
    held_out = held_out_set(mix, config.data.tasks, tcfg.eval_lens, tcfg.eval_per_task) if tcfg.eval_per_task else []
    loader = torch.utils.data.DataLoader(
        StepBatches(mix, tcfg.steps),
        batch_size=None,
        sampler=range(step, last),
        num_workers=num_workers,
        prefetch_factor=4 if num_workers else None,
        pin_memory=device.type == "cuda",
    )

    from tqdm.auto import tqdm

    bar = tqdm(total=tcfg.steps, initial=step, desc="train-hybrid", unit="step", disable=not progress)
    window_tokens, window_start = 0, clock()
    # the pace is the median of this call's recent step times, the first one left out: it compiles and autotunes
    # every kernel (minutes on a fresh machine), and taking it as the pace would stop a short call after one step
    step_times: list[float] = []
    first_step = True
    save_seconds, eval_seconds = 5.0, 0.0
    stopped_early = False
    try:
        for batch in loader:
            t0 = clock()
            seq_len = batch["input_ids"].shape[1]
            micro_rows = max(1, tcfg.micro_batch_tokens // seq_len)
            lr = tcfg.lr_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            terms = step_loss(model, batch, micro_rows, tcfg.lm_weight, device, autocast)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip))
            optimizer.step()
            step += 1
            n_tokens = batch["input_ids"].numel()
            tokens_seen += n_tokens
            window_tokens += n_tokens
            if not first_step:
                step_times = [*step_times[-19:], clock() - t0]
            first_step = False
            bar.update(1)
            if step % tcfg.log_every == 0 or step == last:
                now = clock()
                rate = window_tokens / max(now - window_start, 1e-9)
                window_tokens, window_start = 0, now
                log({"step": step, "seq_len": seq_len, **terms, "grad_norm": grad_norm, "lr": lr,
                     "tokens_per_s": rate, "tokens": tokens_seen, "elapsed_s": now - start_time})  # fmt: skip
                bar.set_postfix(loss=f"{terms['loss']:.3f}", tok_s=f"{rate:,.0f}", T=seq_len)
            if held_out and (step % tcfg.eval_every == 0 or step == tcfg.steps):
                t_eval = clock()
                accuracy, tokens = held_out_accuracy(model, held_out, tcfg.micro_batch_tokens, eos, device, autocast)
                eval_seconds = clock() - t_eval
                window_start += eval_seconds  # the training rate leaves evaluation time out
                log({"step": step, "held_out_exact_match": accuracy, "held_out_token_accuracy": tokens,
                     "eval_s": eval_seconds})  # fmt: skip
                bar.write(f"step {step}: held-out exact match {_means(accuracy)}; answer tokens {_means(tokens)}")
            if step % tcfg.checkpoint_every == 0 and step < last:
                t_save = clock()
                _save_checkpoint(ckpt_path, step, tokens_seen, model, optimizer)
                save_seconds = clock() - t_save
            if time_limit_s is not None and step < last:
                remaining = time_limit_s - (clock() - start_time)
                pace = statistics.median(step_times) if step_times else 0.0
                if remaining < 2 * pace + eval_seconds + 3 * save_seconds + 10:
                    stopped_early = True
                    break
    finally:
        bar.close()
    _save_checkpoint(ckpt_path, step, tokens_seen, model, optimizer)
    finished = step >= tcfg.steps
    log({"event": "finished" if finished else "paused", "step": step, "tokens": tokens_seen,
         "elapsed_s": clock() - start_time, "time_limit": stopped_early})  # fmt: skip
    export(model, tok, export_dir, export_dtype, log_path)
    return RunResult(step, tcfg.steps, finished, export_dir, n_params)


def _means(accuracy: dict[str, float]) -> str:
    return ", ".join(f"{k.split('@')[1]}: {100 * v:.0f}%" for k, v in accuracy.items() if k.startswith("mean@"))
