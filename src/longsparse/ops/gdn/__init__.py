"""Gated DeltaNet (GDN) ops: the dense references and SparseGDN, with FLA's argument names and order."""

from .checks import GDNProblem, check_gdn_inputs
from .config import SparseGDNConfig, SparseGDNKernelConfig
from .naive import naive_chunk_gated_delta_rule, naive_recurrent_gated_delta_rule
from .sparse import sparse_chunk_gated_delta_rule
from .stats import SparseGDNStats

__all__ = [
    "GDNProblem",
    "SparseGDNConfig",
    "SparseGDNKernelConfig",
    "SparseGDNStats",
    "check_gdn_inputs",
    "naive_chunk_gated_delta_rule",
    "naive_recurrent_gated_delta_rule",
    "sparse_chunk_gated_delta_rule",
]
