"""Decoders loaded from Hugging Face checkpoints or GGUF files: a Qwen3.5-style GDN/attention hybrid and the
Llama family (Llama, SmolLM2, Qwen2/3, MiniCPM4), with per-layer execution modes and SparDA's Forecast adapter."""

from .config import DecoderConfig, HybridConfig, RopeConfig
from .forecast import ForecastError, ForecastProjections
from .loader import CheckpointError, LoadedModel, default_model_path, load_model
from .modes import ATTENTION_MODES, GDN_MODES, ExecutionModes
from .registry import supported_architectures

__all__ = [
    "ATTENTION_MODES",
    "GDN_MODES",
    "CheckpointError",
    "DecoderConfig",
    "ExecutionModes",
    "ForecastError",
    "ForecastProjections",
    "HybridConfig",
    "LoadedModel",
    "RopeConfig",
    "default_model_path",
    "load_model",
    "supported_architectures",
]
