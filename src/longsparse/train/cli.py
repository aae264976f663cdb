"""`longsparse train-forecast`: train Forecast projections for a frozen model and save them as an adapter.

The adapter (``forecast.safetensors`` + ``forecast_config.json``, :mod:`longsparse.models.forecast`) goes to
``--out``; so do, by default, the training log (``train.log``: a JSON header line with the parsed arguments and the
config, then one JSON line per optimizer step; a resumed run appends another header) and the checkpoint
(``checkpoint.pt``), which ``--resume`` continues.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..cli_args import add_compute_options, add_device_dtype, positive_int, torch_threads
from ..models.forecast import STORE_DTYPES
from .forecast import INITS, SHORT_CONTEXT_SPARSE, TEACHERS, ForecastTrainingConfig


def configure(parser) -> None:
    d = ForecastTrainingConfig()
    s = SHORT_CONTEXT_SPARSE
    parser.add_argument("--model", default="default", help="checkpoint folder, .gguf file or 'default' (SmolLM2-135M)")
    parser.add_argument(
        "--data",
        default="kjv",
        help="kjv, shakespeare, a text file, or a .npy file of token ids (default: %(default)s)",
    )
    parser.add_argument("--out", required=True, type=Path, help="folder for the adapter, log and checkpoint")
    parser.add_argument("--checkpoint", type=Path, default=None, help="checkpoint file (default: OUT/checkpoint.pt)")
    parser.add_argument("--log", type=Path, default=None, help="JSON-lines log (default: OUT/train.log)")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint if it exists")
    parser.add_argument("--seq-len", type=positive_int, default=d.seq_len, help="tokens per training sequence")
    parser.add_argument("--batch-size", type=positive_int, default=d.batch_size, help="sequences per optimizer step")
    parser.add_argument("--steps", type=positive_int, default=d.steps, help="optimizer steps")
    parser.add_argument(
        "--positions", type=positive_int, default=d.positions, help="supervised query positions per sequence"
    )
    parser.add_argument("--teacher", choices=TEACHERS, default=d.teacher, help="fine (2,1) grid or coarse (32,16)")
    parser.add_argument("--fine-grid", default="2,1", help="fine teacher kernel size,stride (default: %(default)s)")
    parser.add_argument("--partition-k", type=int, default=None, help="separate cells (default: dynamic budget)")
    parser.add_argument("--lr", type=float, default=d.lr, help="AdamW learning rate")
    parser.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW weight decay")
    parser.add_argument("--betas", default="0.9,0.95", help="AdamW betas, two comma-separated numbers")
    parser.add_argument("--eps", type=float, default=d.eps, help="AdamW epsilon")
    parser.add_argument("--grad-clip", type=float, default=d.grad_clip, help="gradient norm clip")
    parser.add_argument("--amp", choices=("auto", "on", "off"), default="auto", help="bf16 autocast (auto: CUDA only)")
    parser.add_argument("--init", choices=INITS, default=d.init, help="query: next layer's mean query; random")
    parser.add_argument("--seed", type=int, default=d.seed, help="initialisation and data seed")
    parser.add_argument("--teacher-chunk", type=positive_int, default=d.teacher_chunk, help="queries per teacher chunk")
    parser.add_argument(
        "--checkpoint-every", type=positive_int, default=d.checkpoint_every, help="optimizer steps between checkpoints"
    )
    parser.add_argument(
        "--keep-snapshots", action="store_true", help="also save the adapter at every checkpoint to OUT/steps/STEP"
    )
    parser.add_argument("--block-size", type=positive_int, default=s.block_size, help="KV block in tokens")
    parser.add_argument(
        "--init-blocks", type=int, default=s.init_blocks, help="first blocks every query attends (attention sinks)"
    )
    parser.add_argument("--window", type=int, default=s.window, help="local window in tokens")
    parser.add_argument("--topk", type=int, default=s.topk, help="blocks per query beyond the local window")
    parser.add_argument("--kernel-size", type=int, default=s.kernel_size, help="student compression window")
    parser.add_argument("--kernel-stride", type=int, default=s.kernel_stride, help="student compression stride")
    parser.add_argument(
        "--adapter-dtype", choices=tuple(STORE_DTYPES), default="bfloat16", help="dtype of the saved adapter weights"
    )
    add_device_dtype(parser, "the frozen model's dtype")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_compute_options(parser)


def _pair(text: str, cast, name: str) -> tuple:
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2:
        raise ValueError(f"--{name} takes two comma-separated numbers, got {text!r}")
    return tuple(cast(p) for p in parts)


def build_config(args) -> ForecastTrainingConfig:
    from ..ops.sparse_attn.config import SparseAttentionConfig

    sparse = SparseAttentionConfig(
        block_size=args.block_size,
        init_blocks=args.init_blocks,
        window=args.window,
        topk=args.topk,
        kernel_size=args.kernel_size,
        kernel_stride=args.kernel_stride,
        dense_len=0,
    )
    return ForecastTrainingConfig(
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        steps=args.steps,
        positions=args.positions,
        teacher=args.teacher,
        fine_grid=_pair(args.fine_grid, int, "fine-grid"),
        partition_k=args.partition_k,
        lr=args.lr,
        weight_decay=args.weight_decay,
        betas=_pair(args.betas, float, "betas"),
        eps=args.eps,
        grad_clip=args.grad_clip,
        amp={"auto": None, "on": True, "off": False}[args.amp],
        init=args.init,
        seed=args.seed,
        teacher_chunk=args.teacher_chunk,
        checkpoint_every=args.checkpoint_every,
        sparse=sparse,
    )


def run(args) -> int:
    with torch_threads(args.threads):
        return train_adapter(args)


def train_adapter(args) -> int:
    from ..models import load_model
    from ..models.loader import default_model_path
    from ..tasks.streams import load_token_stream
    from .forecast import train_forecast

    config = build_config(args)
    out: Path = args.out
    checkpoint = args.checkpoint or out / "checkpoint.pt"
    log_path = args.log or out / "train.log"
    loaded = load_model(args.model, dtype=args.dtype, device=args.device)
    stream = load_token_stream(args.data, loaded.tokenizer, loaded.config.vocab_size)
    base_model = default_model_path().name if args.model == "default" else Path(args.model).name
    out.mkdir(parents=True, exist_ok=True)
    resuming = args.resume and checkpoint.is_file()
    arguments = sorted((k, v) for k, v in vars(args).items() if not k.startswith("_"))
    with open(log_path, "a" if resuming else "w") as log_file:
        header = {
            "arguments": {k: v if isinstance(v, (int, float, bool, type(None))) else str(v) for k, v in arguments},
            "base_model": base_model,
            "data": stream.name,
            "data_tokens": len(stream),
            "device": str(loaded.device),
            "model_dtype": str(loaded.dtype),
            "resumed": resuming,
            "config": config.to_dict(),
        }
        log_file.write(json.dumps(header) + "\n")
        log_file.flush()

        def log(record: dict) -> None:
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()

        def snapshot(step: int, projections) -> None:
            projections.save(out / "steps" / str(step), dtype=STORE_DTYPES[args.adapter_dtype])

        result = train_forecast(
            loaded.model,
            stream,
            config,
            base_model=base_model,
            checkpoint=checkpoint,
            resume=args.resume,
            log=log,
            on_checkpoint=snapshot if args.keep_snapshots else None,
            progress=not args.no_progress,
        )
    result.projections.save(out, dtype=STORE_DTYPES[args.adapter_dtype])
    last = result.history[-1] if result.history else {}
    print(
        f"saved forecast adapter to {out} (step {last.get('step', 0)}, loss {last.get('loss', float('nan')):.4f}, "
        f"recall {last.get('recall', float('nan')):.3f})"
    )
    return 0
