"""Generation: caches, prefill/decode steps over packed batches, sampling and the ``LLM`` API."""

from .api import LLM, Generation, GenerationStats, SamplingParams
from .cache import (
    CacheBytes,
    CompressedKeys,
    ContiguousKVCache,
    GDNStates,
    KVCache,
    allocate_caches,
    allocate_compressed_keys,
)
from .runner import ModelRunner, StepOutput

__all__ = [
    "LLM",
    "CacheBytes",
    "CompressedKeys",
    "ContiguousKVCache",
    "GDNStates",
    "Generation",
    "GenerationStats",
    "KVCache",
    "ModelRunner",
    "SamplingParams",
    "StepOutput",
    "allocate_caches",
    "allocate_compressed_keys",
]
