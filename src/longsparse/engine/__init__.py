"""Generation: caches, prefill/decode steps over packed batches, sampling and the ``LLM`` API."""

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

_API = ("LLM", "Generation", "GenerationStats", "SamplingParams")

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


def __getattr__(name: str):
    # the API builds on the offloaded cache (longsparse.cache), which builds on this package's KVCache: importing the
    # API lazily lets either package be imported first
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'longsparse.engine' has no attribute {name!r}")
