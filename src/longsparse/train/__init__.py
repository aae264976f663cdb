"""Forecast distillation: train SparDA's Forecast projections on a frozen model (sparda-notes §2.4–2.5).

:mod:`~longsparse.train.objective` (teacher scores, candidates, rest-bucket KL), :mod:`~longsparse.train.data` (token
streams and deterministic draws), :mod:`~longsparse.train.checkpoint`, :mod:`~longsparse.train.forecast` (the loop) and
:mod:`~longsparse.train.cli` (``longsparse train-forecast``).
"""

from .forecast import SHORT_CONTEXT_SPARSE, ForecastTrainingConfig, TrainingResult, train_forecast

__all__ = ["SHORT_CONTEXT_SPARSE", "ForecastTrainingConfig", "TrainingResult", "train_forecast"]
