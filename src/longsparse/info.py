"""`longsparse info`: what this installation can run."""

from __future__ import annotations

import importlib
import platform

import torch

from . import __version__
from .cli_args import available_cpus, default_threads
from .ops._triton import triton_mode

_OPTIONAL = (
    "triton",
    "transformers",
    "gguf",
    "tokenizers",
    "safetensors",
    "matplotlib",
    "fla",
    "flash_qla",
    "tilelang",
)


def _version_of(module: str) -> str | None:
    try:
        mod = importlib.import_module(module)
    except Exception:
        return None
    return getattr(mod, "__version__", "installed")


def collect() -> dict:
    """Versions, devices and optional packages as a plain dict (JSON-serialisable)."""
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append(
                {
                    "index": i,
                    "name": p.name,
                    "memory_gib": round(p.total_memory / 2**30, 1),
                    "capability": f"{p.major}.{p.minor}",
                    "multiprocessors": p.multi_processor_count,
                }
            )
    return {
        "longsparse": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "gpus": gpus,
        "cpus": available_cpus(),
        "default_threads": default_threads(),
        "triton_kernels": triton_mode(),
        "optional": {name: _version_of(name) for name in _OPTIONAL},
    }


def format_report(info: dict) -> str:
    lines = [
        f"longsparse   {info['longsparse']}",
        f"python       {info['python']} ({info['platform']})",
        f"torch        {info['torch']} (CUDA runtime: {info['cuda_runtime'] or 'none'})",
    ]
    if info["gpus"]:
        for g in info["gpus"]:
            lines.append(
                f"gpu {g['index']}        {g['name']}, {g['memory_gib']} GiB, sm_{g['capability'].replace('.', '')}, "
                f"{g['multiprocessors']} SMs"
            )
    else:
        lines.append("gpu          none (CPU only: torch reference paths)")
    lines.append(
        f"cpus         {info['cpus']} for this process; commands run {info['default_threads']} torch thread(s) "
        "unless --threads says otherwise (fewer while other processes load the CPUs)"
    )
    mode = info["triton_kernels"]
    meaning = {
        "compiled": "compiled for the GPU",
        "interpreter": "Triton's CPU interpreter (TRITON_INTERPRET=1): correct but slow",
        "unavailable": "not runnable here; torch reference paths are used",
    }[mode]
    lines.append(f"kernels      {mode}: {meaning}")
    lines.append("optional packages:")
    for name, ver in info["optional"].items():
        lines.append(f"  {name:<13}{ver if ver else '-- not installed'}")
    return "\n".join(lines)


def configure(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args) -> int:
    import json

    info = collect()
    print(json.dumps(info, indent=2) if args.json else format_report(info))
    return 0
