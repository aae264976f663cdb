"""`longsparse bench gdn` needs a GPU to time anything; on the CPU: how its rows name the main-pass variants."""

import dataclasses

from longsparse.bench.gdn import variant
from longsparse.ops.gdn import SparseGDNConfig


def test_variant_names_say_what_differs_from_the_defaults():
    base = SparseGDNConfig()
    assert variant(base) == "walk"
    assert variant(dataclasses.replace(base, main_pass="csr", block_v=16)) == "csr_bv16"
    assert variant(dataclasses.replace(base, main_warps=8)) == "walk_w8"
    assert variant(dataclasses.replace(base, block_v=64, main_warps=8)) == "walk_bv64_w8"
