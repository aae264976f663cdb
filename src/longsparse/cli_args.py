"""What the `longsparse` commands share: the parser class (one-line errors, every default in the help, arguments
loaded from a command's module only when that command runs), argument types that name the bad value and the limit,
the options every computing command takes (``--threads``, ``--verbose``, ``--device``, ``--dtype``) and the parsers
of the ``KEY=VALUE,...`` options.

This module imports argparse and the standard library only, never torch, so that ``longsparse --help`` answers
without loading the libraries the commands compute with.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib
import math
import os
from contextlib import contextmanager
from pathlib import Path

DTYPES = ("auto", "float32", "bfloat16", "float16")
"""Model dtypes a command takes; auto: bfloat16 on CUDA, float32 on a CPU."""
DEVICE_HELP = "auto (cuda if there is a GPU, else cpu), cpu, cuda or cuda:N"


class UsageError(ValueError):
    """A command line that does not parse; ``prog`` is the (sub)command it was given to."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default after its help, unless the help already speaks of it or there is none to show
    (no default, a flag that is off, an empty list)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if not self._shows_default(action) or "default" in text.lower():
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"

    def _format_action(self, action):
        if not action.help and self._shows_default(action):  # argparse prints nothing for an option without help
            action = copy.copy(action)
            action.help = "default: %(default)s"
        return super()._format_action(action)

    @staticmethod
    def _shows_default(action) -> bool:
        default = action.default
        if default is None or default is False or default is argparse.SUPPRESS or default == [] or action.required:
            return False
        return bool(action.option_strings) or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (raised as :class:`UsageError`, which ``longsparse``'s ``main``
    prints) and whose help shows defaults. With ``module``, the parser's arguments and its command come from that
    module only when this parser parses or prints its help: ``module.configure(parser)`` adds them and
    ``module.run(args) -> int`` is the command (``args._run``; a subclass whose parsers sit below another command's
    names another attribute, so that the two do not overwrite each other)."""

    run_attribute = "_run"

    def __init__(self, *args, module: str | None = None, formatter_class=HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)
        self._module = module

    def _load(self) -> None:
        if self._module is None:
            return
        module, self._module = importlib.import_module(self._module), None
        module.configure(self)
        self.set_defaults(**{self.run_attribute: module.run})

    def parse_known_args(self, args=None, namespace=None):
        self._load()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._load()
        return super().format_help()

    def format_usage(self) -> str:
        self._load()
        return super().format_usage()

    def error(self, message: str):
        raise UsageError(self.prog, f"{message} (see {self.prog} --help)")


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    return _int_at_least(text, 1)


def nonnegative_int(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
    return value


def nonnegative_float(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text}")
    return value


def probability(text: str) -> float:
    """An argparse type: a number in (0, 1]."""
    value = _finite(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def device_name(text: str) -> str:
    """An argparse type: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (whether that device exists here is the model
    loader's check, which names what is missing)."""
    kind, sep, index = text.partition(":")
    if text in ("auto", "cpu", "cuda") or (kind == "cuda" and sep and index.isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not a device: {DEVICE_HELP}")


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota (``cpu.max``) where one is set."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="torch CPU threads (default: the CPUs this process may run on, from its affinity mask and cgroup quota, "
        "less those other processes keep busy by the load average; at least 1)",
    )


def add_verbose(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show the progress bars of the libraries used (e.g. transformers' GGUF conversion) and, on an error, its "
        "traceback",
    )


def add_device_dtype(parser: argparse.ArgumentParser, dtype_help: str = "model dtype") -> None:
    parser.add_argument("--device", type=device_name, default="auto", help=DEVICE_HELP + " (default: %(default)s)")
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help=f"{dtype_help}; auto: bfloat16 on CUDA, float32 on a CPU (default: %(default)s)",
    )


def add_tensor_parallel_size(
    parser: argparse.ArgumentParser, default: int = 1, measured: str = "one process: no workers"
) -> None:
    parser.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=positive_int,
        default=default,
        metavar="N",
        help="split the model by heads across N worker processes: one per GPU (cuda:0 … cuda:N-1, NCCL), gloo "
        f"processes on a CPU (docs/scale-out.md; default: %(default)s, {measured})",
    )


def add_compute_options(parser: argparse.ArgumentParser) -> None:
    """``--threads`` and ``--verbose``: the options of every command that computes."""
    add_threads(parser)
    add_verbose(parser)


def default_threads() -> int:
    """torch threads for a command without ``--threads``: the CPUs this process may run on (:func:`available_cpus`)
    less the share of the machine that other processes keep busy (its 1-minute load average over its CPUs), at least
    one. On a CPU shared with busy processes, a second intra-op thread waits for a core at every op; one thread then
    runs prefill and decode faster (docs/models.md)."""
    cpus = available_cpus()
    busy = min(1.0, os.getloadavg()[0] / (os.cpu_count() or cpus))
    return max(1, round(cpus * (1.0 - busy)))


@contextmanager
def torch_threads(threads: int | None):
    """torch's intra-op CPU threads set to ``threads`` (None: :func:`default_threads`) inside the block, restored
    after it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads or default_threads())
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def library_progress_bars(shown: bool):
    """Unless ``shown``, hides the tqdm progress bars that the libraries a command loads draw by themselves (tqdm
    reads ``TQDM_DISABLE`` when it is first imported; a bar whose caller passes ``disable=`` keeps its own choice).
    The environment is restored afterwards."""
    if shown or "TQDM_DISABLE" in os.environ:
        yield
        return
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        os.environ.pop("TQDM_DISABLE", None)


def parse_sparse_attention_config(text: str):
    """``"block_size=16,window=32,..."`` -> a :class:`~longsparse.ops.sparse_attn.SparseAttentionConfig` (unnamed
    fields keep MiniCPM4's defaults); ValueError naming a malformed item, an unknown field or a value that is not an
    integer."""
    from .ops.sparse_attn.config import SparseAttentionConfig

    fields = {f.name for f in dataclasses.fields(SparseAttentionConfig)}
    values: dict[str, int] = {}
    for name, value in _items(text, "--sparse-attention-config"):
        if name not in fields:
            raise ValueError(f"--sparse-attention-config: unknown field {name!r}; fields: {', '.join(sorted(fields))}")
        try:
            values[name] = int(value)
        except ValueError:
            raise ValueError(f"--sparse-attention-config: {name} must be an integer, got {value!r}") from None
    return SparseAttentionConfig(**values)


def parse_sparse_gdn_config(text: str):
    """``"selection=random,seed=3,tier_ratios=0.1/0.3/0.9"`` -> a :class:`~longsparse.ops.gdn.SparseGDNConfig`
    (unnamed fields keep the paper's defaults). Tuples are written with ``/``; booleans as true / false; ``none`` for
    an optional field. ValueError naming a malformed item, an unknown field or a value of the wrong type."""
    from .ops.gdn.config import SparseGDNConfig

    kinds = {f.name: str(f.type) for f in dataclasses.fields(SparseGDNConfig)}
    values: dict[str, object] = {}
    for name, value in _items(text, "--gdn-config"):
        if name not in kinds:
            raise ValueError(f"--gdn-config: unknown field {name!r}; fields: {', '.join(sorted(kinds))}")
        try:
            values[name] = _parse_field(kinds[name], value)
        except ValueError:
            raise ValueError(f"--gdn-config: {name} ({kinds[name]}) cannot be {value!r}") from None
    return SparseGDNConfig(**values)


def _items(text: str, option: str) -> list[tuple[str, str]]:
    """``"a=1, b=2"`` -> ``[("a", "1"), ("b", "2")]``; ValueError naming an item that is not KEY=VALUE."""
    items = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{option}: {item!r} is not KEY=VALUE")
        items.append((name.strip(), value.strip()))
    return items


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
