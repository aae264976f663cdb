"""Training: SparDA's Forecast projections on a frozen model, and the small Qwen3.5 hybrid that SparseGDN's quality
is measured on.

Forecast distillation (SparDA (Fu et al., arXiv:2606.04511) Sec. 4.2): :mod:`~longsparse.train.objective` (teacher
scores, candidates, rest-bucket KL), :mod:`~longsparse.tasks.streams` (token streams and deterministic draws),
:mod:`~longsparse.train.checkpoint`, :mod:`~longsparse.train.forecast` (the loop) and :mod:`~longsparse.train.cli`
(``longsparse train-forecast``).

The hybrid (docs/hybrid.md): :mod:`~longsparse.train.model`, :mod:`~longsparse.train.tokenizer`,
:mod:`~longsparse.train.hybrid_data` (text windows and RULER retrieval rows), :mod:`~longsparse.train.hybrid` (the
resumable, time-limited loop and the export) and :mod:`~longsparse.train.hybrid_cli` (``longsparse train-hybrid``)::

    from longsparse.train import RunConfig, train

    result = train("runs/hybrid", RunConfig(), time_limit_s=540)   # call again to continue

SparseGDN's quality testbed, a model with GDN layers only trained on needles and associative recall in byte-level
text: :mod:`~longsparse.train.state_recall` (``python -m longsparse.train.state_recall``).
"""

from .forecast import SHORT_CONTEXT_SPARSE, ForecastTrainingConfig, TrainingResult, train_forecast
from .hybrid import RunConfig, RunResult, TrainConfig, export, train
from .hybrid_data import DataConfig, HybridDataMix, answer_text
from .model import HybridModelConfig, build_model
from .tokenizer import train_bpe

__all__ = [
    "SHORT_CONTEXT_SPARSE",
    "DataConfig",
    "ForecastTrainingConfig",
    "HybridDataMix",
    "HybridModelConfig",
    "RunConfig",
    "RunResult",
    "TrainConfig",
    "TrainingResult",
    "answer_text",
    "build_model",
    "export",
    "train",
    "train_bpe",
    "train_forecast",
]
