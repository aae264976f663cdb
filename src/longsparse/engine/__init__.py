"""Generation: caches, prefill/decode steps over packed batches, sampling and the ``LLM`` API."""

from .api import LLM, Generation, GenerationStats, SamplingParams
from .cache import CacheBytes, ContiguousKVCache, GDNStates, KVCache, allocate_caches
from .runner import ModelRunner, StepOutput

__all__ = [
    "LLM",
    "CacheBytes",
    "ContiguousKVCache",
    "GDNStates",
    "Generation",
    "GenerationStats",
    "KVCache",
    "ModelRunner",
    "SamplingParams",
    "StepOutput",
    "allocate_caches",
]
