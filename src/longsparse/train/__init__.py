"""Training: the small Qwen3.5-architecture hybrid that SparseGDN's quality is measured on (docs/hybrid.md).

    from longsparse.train import RunConfig, train

    result = train("runs/hybrid", RunConfig(), time_limit_s=540)   # call again to continue

Command line: ``longsparse train-hybrid --out runs/hybrid``.
"""

from .data import DataConfig, HybridDataMix, answer_text
from .hybrid import RunConfig, RunResult, TrainConfig, export, train
from .model import HybridModelConfig, build_model
from .tokenizer import train_bpe

__all__ = [
    "DataConfig",
    "HybridDataMix",
    "HybridModelConfig",
    "RunConfig",
    "RunResult",
    "TrainConfig",
    "answer_text",
    "build_model",
    "export",
    "train",
    "train_bpe",
]
