"""`longsparse train-hybrid`: train (or continue training) the small Qwen3.5 hybrid in a run folder.

Every call trains until the run is done or ``--time-limit-s`` would pass, saves a checkpoint and the Hugging Face
export (``OUT/model``) and prints where it stopped; the same command continues the run (docs/hybrid.md). A folder that
holds a run continues with the options it was started with (its ``run.json``): ``--out`` alone is enough, and an
option given that differs from them is refused with the difference named.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from ..cli_args import add_compute_options, device_name, nonnegative_int, positive_int, torch_threads
from ..tasks.tokens import parse_length

PRESETS = ("default", "smoke")


def configure(parser) -> None:
    parser.add_argument(
        "--out", default="runs/hybrid", help="run folder; one that holds a run continues it (default: %(default)s)"
    )
    parser.add_argument(
        "--preset",
        choices=PRESETS,
        default=None,
        help="default: the model and schedule of docs/hybrid.md; smoke: a small model and 20 steps at 512-1K tokens "
        "to check a machine (same GDN geometry). Options override it. Default: the run folder's saved options when "
        "it holds a run, else 'default'",
    )
    parser.add_argument("--steps", type=positive_int, default=None, help="optimizer steps of the whole run")
    parser.add_argument("--time-limit-s", type=float, default=540.0, help="stop (resumably) before this many seconds")
    parser.add_argument(
        "--device",
        type=device_name,
        default=None,
        help="auto, cpu, cuda or cuda:N (default: cuda if available, else cpu)",
    )
    parser.add_argument(
        "--workers",
        type=nonnegative_int,
        default=None,
        help="batch-building processes (default: 0 on cpu, else min(12, cores-2))",
    )
    parser.add_argument("--tokenizer", default=None, help="tokenizer.json for a new run (default: learn one)")
    parser.add_argument(
        "--init-from",
        default=None,
        metavar="FOLDER",
        help="start a new run from the weights of another run folder (e.g. a copy drill) or of an exported model "
        "folder (e.g. runs/hybrid/model), with its tokenizer",
    )
    parser.add_argument("--seed", type=int, default=None, help="model initialisation and data seed (default: 0)")
    parser.add_argument("--seq-lens", default=None, help="curriculum row lengths, e.g. 512,1k,2k,4k,8k")
    parser.add_argument("--stage-ends", default=None, help="where each length ends (fraction of steps)")
    parser.add_argument("--tokens-per-step", type=positive_int, default=None, help="tokens per optimizer step")
    parser.add_argument(
        "--micro-batch-tokens", type=positive_int, default=None, help="tokens per forward/backward pass"
    )
    parser.add_argument(
        "--text-fraction", type=float, default=None, help="share of rows that are plain text (default: 0.1)"
    )
    parser.add_argument(
        "--copy-fraction",
        type=float,
        default=None,
        help="share of rows that are copy rows: random tokens, repeated (default: 0.3)",
    )
    parser.add_argument(
        "--copy-tokens",
        choices=("uniform", "stream"),
        default=None,
        help="copy rows' random tokens: uniform over the vocabulary's tokens that occur in the text, or windows of "
        "the token stream (default: uniform)",
    )
    parser.add_argument("--tasks", default=None, help="comma-separated RULER training tasks")
    parser.add_argument(
        "--extra-query-share",
        type=float,
        default=None,
        help="share of a multi-key NIAH row left for more questions about its unasked keys (default: 0.5)",
    )
    parser.add_argument(
        "--prompt-loss",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="LM loss on retrieval prompts too, not only on their answers (default: on)",
    )
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate")
    parser.add_argument("--warmup-steps", type=nonnegative_int, default=None, help="steps of learning-rate warm-up")
    parser.add_argument("--hidden-size", type=positive_int, default=None, help="model width")
    parser.add_argument("--intermediate-size", type=positive_int, default=None, help="MLP width")
    parser.add_argument(
        "--layers", type=positive_int, default=None, help="decoder layers (every 4th is full attention)"
    )
    parser.add_argument("--vocab-size", type=positive_int, default=None, help="tokenizer vocabulary of a new run")
    parser.add_argument("--eval-every", type=positive_int, default=None, help="steps between held-out evaluations")
    parser.add_argument("--checkpoint-every", type=positive_int, default=None, help="steps between checkpoints")
    parser.add_argument("--log-every", type=positive_int, default=None, help="steps between log lines")
    parser.add_argument(
        "--export-dtype", choices=("bfloat16", "float32"), default="bfloat16", help="dtype of the exported model"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_compute_options(parser)


def build_config(args):
    """The :class:`~longsparse.train.RunConfig` of the preset (without ``--preset``: of the run ``--out`` holds, if
    any) with the options given on the command line."""
    from .hybrid import RunConfig, TrainConfig, load_run_config
    from .hybrid_data import DataConfig
    from .model import HybridModelConfig

    model, data, train = HybridModelConfig(), DataConfig(), TrainConfig()
    saved = load_run_config(args.out) if args.preset is None else None
    if saved is not None:
        model, data, train = saved.model, saved.data, saved.train
    elif args.preset == "smoke":
        model = HybridModelConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=4)
        data = DataConfig(seq_lens=(512, 1024), stage_ends=(0.5, 1.0), tokens_per_step=8192)
        train = TrainConfig(steps=20, warmup_steps=2, log_every=2, eval_every=10, checkpoint_every=10,
                            eval_per_task=1, eval_lens=(1024,), micro_batch_tokens=8192)  # fmt: skip

    def pick(**values):
        return {k: v for k, v in values.items() if v is not None}

    model = dataclasses.replace(
        model,
        **pick(
            vocab_size=args.vocab_size,
            hidden_size=args.hidden_size,
            intermediate_size=args.intermediate_size,
            num_hidden_layers=args.layers,
        ),
    )
    seq_lens = tuple(parse_length(x) for x in args.seq_lens.split(",")) if args.seq_lens else None
    stage_ends = tuple(float(x) for x in args.stage_ends.split(",")) if args.stage_ends else None
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip()) if args.tasks else None
    data = dataclasses.replace(
        data,
        **pick(
            seq_lens=seq_lens,
            stage_ends=stage_ends,
            tokens_per_step=args.tokens_per_step,
            text_fraction=args.text_fraction,
            copy_fraction=args.copy_fraction,
            copy_tokens=args.copy_tokens,
            prompt_loss=args.prompt_loss,
            extra_query_share=args.extra_query_share,
            tasks=tasks,
            seed=args.seed,
        ),
    )
    train = dataclasses.replace(
        train,
        **pick(
            steps=args.steps,
            lr=args.lr,
            warmup_steps=args.warmup_steps,
            micro_batch_tokens=args.micro_batch_tokens,
            eval_every=args.eval_every,
            checkpoint_every=args.checkpoint_every,
            log_every=args.log_every,
            seed=args.seed,
        ),
    )
    return RunConfig(model, data, train)


def run(args) -> int:
    with torch_threads(args.threads):
        return train_run(args)


def train_run(args) -> int:
    import torch

    from .hybrid import train

    config = build_config(args)
    from ..models.loader import resolve_device

    device = resolve_device(args.device)
    workers = args.workers
    if workers is None:
        workers = 0 if device.type == "cpu" else max(0, min(12, (os.cpu_count() or 2) - 2))
    # batches are built in forked loader processes: the tokenizer's own thread pool must not be running at the fork
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # FLA 0.6.0 hands its chunked GDN to FlashQLA when that is installed, which compiles every new shape (~40 s):
    # the curriculum's row lengths and row counts would pay that in every chained command
    os.environ.setdefault("FLA_FLASH_QLA", "0")
    result = train(
        args.out,
        config,
        device=device,
        time_limit_s=args.time_limit_s,
        num_workers=workers,
        tokenizer=args.tokenizer,
        init_from=args.init_from,
        export_dtype=getattr(torch, args.export_dtype),
        progress=not args.no_progress,
    )
    state = "finished" if result.finished else "paused (run the same command again to continue)"
    print(f"{state}: step {result.step}/{result.steps}, {result.parameters:,} parameters, export {result.export_dir}")
    return 0
