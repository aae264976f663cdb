"""Generation: prefill/decode steps over packed batches (plan once per step, run the layers), sampling and the ``LLM``
API. The caches it allocates are :mod:`longsparse.cache`'s (their types are re-exported here)."""

from ..cache import CacheBytes, CompressedKeys, ContiguousKVCache, GDNStates, KVCache
from .api import LLM, Generation, GenerationStats, SamplingParams
from .cache import allocate_caches, allocate_compressed_keys
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
