"""Capacity planning: per-sequence bytes of each decode mode (exactly the layouts'), the largest batch that fits a
budget, and a refusal that says what was asked, what is free and what would fit."""

import pytest
import torch

from longsparse.cache import (
    DECODE_MODES,
    CapacityError,
    CompressedKeys,
    ContiguousKVCache,
    block_layout,
    check_fits,
    footprint,
    max_batch,
)
from longsparse.cache.capacity import host_available_bytes, offloaded_layers, step_activation_bytes
from longsparse.ops.sparse_attn import MINICPM4

GIB = 2**30
MINICPM = dict(attention_layers=tuple(range(32)), num_kv_heads=2, head_dim=128, dtype=torch.bfloat16,
               config=MINICPM4)  # fmt: skip


def test_offloaded_layers_per_mode():
    layers = (3, 7, 11)
    assert offloaded_layers(DECODE_MODES["sparse_offload"], layers) == layers
    assert offloaded_layers(DECODE_MODES["sparda"], layers) == (7, 11)
    assert offloaded_layers(DECODE_MODES["sparda_noprefetch"], layers) == (7, 11)
    assert offloaded_layers(DECODE_MODES["sparse_gpu"], layers) == ()
    with pytest.raises(ValueError, match="keeps a contiguous cache on the GPU"):
        block_layout(DECODE_MODES["sparda_gpu"], layers, 1, 64, 2, 8, torch.float32, MINICPM4)


def test_minicpm_per_sequence_bytes_at_128k():
    fp = {m: footprint(m, context=131072, **MINICPM) for m in DECODE_MODES}
    assert fp["dense_gpu"].gpu_per_seq == 4 * GIB and fp["dense_gpu"].host_per_seq == 0
    assert 4 * GIB < fp["sparse_gpu"].gpu_per_seq < 4.15 * GIB  # blocks + compressed keys
    assert fp["sparse_offload"].host_per_seq == 4 * GIB
    assert fp["sparda"].host_per_seq == 31 * GIB // 8
    assert fp["sparda"].gpu_per_seq < fp["sparse_gpu"].gpu_per_seq / 8  # the point of offloading
    assert fp["sparda"].gpu_per_seq == fp["sparda_noprefetch"].gpu_per_seq


@pytest.mark.parametrize("mode", list(DECODE_MODES))
def test_footprint_is_what_the_caches_allocate_for_any_batch(mode):
    """Each mode's bytes for 1, 3 and 8 sequences of 5000 tokens are exactly the bytes of the caches it allocates (on
    the meta device: nothing is really allocated): the contiguous cache (whole blocks for the block-sparse modes) or
    the block layout, plus the compressed keys of the block-sparse modes."""
    m = DECODE_MODES[mode]
    fp = footprint(mode, context=5000, **MINICPM)
    layers = MINICPM["attention_layers"]
    sparse = m.attention != "dense"
    for n in (1, 3, 8):
        host = 0
        if m.offload:
            lay = block_layout(m, layers, n, 5000, 2, 128, torch.bfloat16, MINICPM4)
            kv, host = lay.gpu_bytes(), lay.host_bytes()
        else:
            contiguous = ContiguousKVCache(layers, n, 5000, 2, 128, torch.bfloat16, "meta",
                                           block_size=MINICPM4.block_size if sparse else None)  # fmt: skip
            kv = contiguous.nbytes().host  # meta tensors count as "not on the GPU"
        compressed = CompressedKeys(layers, n, 5000, 2, 128, MINICPM4, torch.bfloat16, "meta").nbytes().host
        assert fp.gpu_bytes(n) == kv + (compressed if sparse else 0)
        assert fp.host_bytes(n) == host


def test_max_batch_takes_the_tighter_of_gpu_and_host():
    fp = footprint("sparda", context=131072, **MINICPM)
    host_bound = max_batch(fp, 120 * GIB, 112 * GIB)
    assert host_bound == 112 * GIB // fp.host_per_seq == 28
    assert max_batch(fp, 120 * GIB, 2048 * GIB) == (120 * GIB - fp.gpu_fixed) // fp.gpu_per_seq
    assert max_batch(footprint("sparse_gpu", context=131072, **MINICPM), 120 * GIB, None) == 29


def test_a_request_that_does_not_fit_is_refused_with_numbers():
    fp = footprint("sparse_gpu", context=131072, step_bytes_per_seq=1 << 20, **MINICPM)
    check_fits(fp, 4, 20 * GIB, None)
    with pytest.raises(CapacityError, match=r"8 sequences of up to 131072 tokens .* at most 4 sequences") as err:
        check_fits(fp, 8, 20 * GIB, None)
    assert isinstance(err.value, ValueError) and "offload='cpu'" in str(err.value)
    off = footprint("sparda", context=131072, **MINICPM)
    with pytest.raises(CapacityError, match="pinned host memory"):
        check_fits(off, 32, 100 * GIB, 112 * GIB)


def test_host_memory_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       132000000 kB\nMemAvailable:   100000000 kB\n")
    assert host_available_bytes(4 * GIB, meminfo) == 100000000 * 1024 - 4 * GIB
    assert host_available_bytes(0, tmp_path / "missing") is None


def test_step_activations_grow_with_vocabulary_and_widths():
    small = step_activation_bytes(576, 1536, 49152, torch.bfloat16)
    big = step_activation_bytes(4096, 16384, 73448, torch.bfloat16)
    assert 0 < small < big < 2 << 20


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="decode mode must be one of"):
        footprint("sparse_cpu", context=10, **MINICPM)
