"""The `longsparse` command line.

Each subcommand lives in the module that owns its work and provides two functions: ``configure(parser)`` adds its
arguments, ``run(args) -> int`` does the work. A command's module is imported only when that command is given, so
``longsparse --help`` loads no torch and a command loads only what it uses. Errors a user can fix (bad values,
missing files or packages, a request that does not fit) end as one line on stderr and exit status 2.
"""

from __future__ import annotations

import os
import sys

from . import __version__
from .cli_args import CommandParser, UsageError, library_progress_bars

# (name, module, one-line help)
COMMANDS: list[tuple[str, str, str]] = [
    ("generate", "longsparse.engine.cli", "generate text with a model loaded from a checkpoint or GGUF file"),
    ("serve", "longsparse.serve.cli", "serve a model over HTTP with OpenAI's API (continuous batching)"),
    ("info", "longsparse.info", "versions, GPU, how Triton kernels run here, optional packages"),
    ("eval", "longsparse.eval.cli", "RULER-style long-context evaluation and paired comparisons of two runs"),
    ("bench", "longsparse.bench.cli", "benchmarks against the strongest available peers"),
    ("train-forecast", "longsparse.train.cli", "train SparDA Forecast projections for a frozen model (an adapter)"),
    (
        "train-hybrid",
        "longsparse.train.hybrid_cli",
        "train the small Qwen3.5 hybrid that SparseGDN quality is measured on",
    ),
]
DESCRIPTION = (
    "Long-context LLM inference: SparseGDN sparse prefill for Gated DeltaNet layers and SparDA block-sparse "
    "attention with a KV cache offloaded to host memory. Start with: longsparse generate --model default --prompt "
    "'The capital of France is' --max-new-tokens 8"
)
USER_ERRORS = (ValueError, ImportError, OSError)
"""What a user can fix: bad values and requests that do not fit (ValueError, which the loaders' CheckpointError and
the capacity model's CapacityError are), a missing optional package (ImportError naming the extra), a missing or
unreadable file (OSError)."""


def build_parser() -> CommandParser:
    parser = CommandParser(prog="longsparse", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)
    for name, module, help_text in COMMANDS:
        sub.add_parser(name, help=help_text, description=help_text, module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = None
    try:
        # before the command's module imports torch, which imports tqdm
        with library_progress_bars(shown="--verbose" in argv):
            args, extra = parser.parse_known_args(argv)
            if extra:
                command = f"{parser.prog} {args.command}"
                raise UsageError(command, f"unrecognized arguments: {' '.join(extra)} (see {command} --help)")
            return int(args._run(args) or 0)
    except UsageError as exc:
        print(f"{exc.prog}: error: {exc}", file=sys.stderr)
    except BrokenPipeError:  # stdout's reader went away (`| head`): no error to report, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except USER_ERRORS as exc:
        if getattr(args, "verbose", False):
            raise
        prog = parser.prog if args is None else f"{parser.prog} {args.command}"
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
    return 2


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename is not None and str(exc.filename) not in text:
        text += f": {exc.filename}"
    return text


if __name__ == "__main__":
    sys.exit(main())
