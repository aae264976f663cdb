"""`longsparse bench gdn` needs a GPU to time anything; on the CPU: how its rows name the main-pass variants."""

import dataclasses

from longsparse.bench.gdn import choices, variant
from longsparse.ops.gdn import SparseGDNConfig


def test_variant_names_say_what_differs_from_the_defaults():
    base = SparseGDNConfig()
    tile = next(bv for bv in (32, 64) if bv != base.block_v)  # a value tile other than the default
    assert variant(base) == "walk"
    assert variant(dataclasses.replace(base, main_pass="csr", block_v=16)) == "csr_bv16"
    assert variant(dataclasses.replace(base, main_warps=8)) == "walk_w8"
    assert variant(dataclasses.replace(base, block_v=tile, main_warps=8)) == f"walk_bv{tile}_w8"
    assert variant(dataclasses.replace(base, block_v=base.block_v, main_warps=8)) == "walk_w8"
    other = next(c for c in ("w", "ks") if c != base.walk_correction)
    assert variant(dataclasses.replace(base, walk_correction=other, block_v=tile)) == f"walk_{other}_bv{tile}"
    assert variant(dataclasses.replace(base, main_pass="csr", walk_correction=other)) == "csr"  # one csr form
    for where in ("inline", "stored"):  # the default picks one of them by length: both are named
        assert base.walk_scores == "auto" and variant(dataclasses.replace(base, walk_scores=where)) == f"walk_{where}"


def test_list_flags_take_distinct_allowed_values():
    assert choices("32,16", (16, 32, 64), int) == [32, 16]
    assert choices("walk", ("walk", "csr"), str) == ["walk"]
    for bad in ("", "32,32", "48", "x"):
        assert choices(bad, (16, 32, 64), int) is None
