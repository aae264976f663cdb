"""Dense attention through SDPA: ``causal_sdpa`` (prefill, with and without a cached prefix) and
``grouped_decode_sdpa`` (one token per sequence) against a float32 reference — on the CPU at small shapes, and on the
GPU with the strided q/k/v views the projections give, under each of SDPA's CUDA backends (MiniCPM4's 32 q / 2 kv
heads × 128 and Qwen3.5's 16 / 4 × 256)."""

import pytest
import torch

from longsparse.models.attention import causal_sdpa, grouped_decode_sdpa
from tests.helpers import rel_err

GEOMETRIES = [(32, 2, 128), (16, 4, 256)]
BACKENDS = ["default", "flash_attention", "cudnn_attention", "efficient_attention"]


def _reference(q, k, v, prefix):
    """float32 softmax attention, KV heads repeated: ``q [T, H, D]``, ``k, v [1, Hkv, prefix + T, D]``."""
    T, H, D = q.shape
    G = H // k.shape[1]
    kf, vf = (t[0].float().repeat_interleave(G, dim=0) for t in (k, v))
    s = torch.einsum("thd,hsd->hts", q.float(), kf) * D**-0.5
    rows = torch.arange(prefix, prefix + T, device=q.device)[:, None]
    s = s.masked_fill(torch.arange(k.shape[2], device=q.device)[None, :] > rows, float("-inf"))
    return torch.einsum("hts,hsd->thd", s.softmax(-1), vf)


def _decode_reference(q, k, v, mask):
    """float32: ``q [N, H, D]`` over ``k, v [N, Hkv, L, D]`` where ``mask [N, 1, 1, L]``."""
    G = q.shape[1] // k.shape[1]
    kf, vf = (t.float().repeat_interleave(G, dim=1) for t in (k, v))
    s = torch.einsum("nhd,nhsd->nhs", q.float(), kf) * q.shape[-1] ** -0.5
    s = s.masked_fill(~mask[:, :, 0, :], float("-inf"))
    return torch.einsum("nhs,nhsd->nhd", s.softmax(-1), vf)


def _decode_inputs(N, H, Hkv, D, L, device, dtype, gen):
    q = torch.randn(N, H, D, device=device, dtype=dtype, generator=gen)
    # a cache of capacity L + 37 read up to L, as DenseAttention reads it
    k, v = (torch.randn(N, Hkv, L + 37, D, device=device, dtype=dtype, generator=gen)[:, :, :L] for _ in range(2))
    lengths = torch.randint(1, L + 1, (N,), device=device, generator=gen)
    mask = (torch.arange(L, device=device)[None, :] < lengths[:, None])[:, None, None, :]
    return q, k, v, mask


@pytest.mark.parametrize("geometry", [(8, 2, 16), (4, 4, 32), (6, 1, 8)], ids=["gqa", "mha", "mqa"])
def test_sdpa_paths_match_the_float32_reference_on_the_cpu(geometry):
    """Prefill without and with a cached prefix (the bottom-right causal mask), and the grouped decode."""
    H, Hkv, D = geometry
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(40, H, D, generator=gen)
    k, v = (torch.randn(1, Hkv, 47, D, generator=gen) for _ in range(2))
    assert rel_err(causal_sdpa(q, k, v, 7), _reference(q, k, v, 7)) < 1e-5
    assert rel_err(causal_sdpa(q, k[:, :, :40], v[:, :, :40], 0), _reference(q, k[:, :, :40], v[:, :, :40], 0)) < 1e-5
    q, k, v, mask = _decode_inputs(5, H, Hkv, D, 29, "cpu", torch.float32, gen)
    assert rel_err(grouped_decode_sdpa(q, k, v, mask), _decode_reference(q, k, v, mask)) < 1e-5


def _under_backend(backend: str, fn, *args):
    """``fn(*args)`` with SDPA pinned to ``backend`` ("default": SDPA's own choice); skips if it refuses the inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        if backend == "default":
            return fn(*args)
        with sdpa_kernel([getattr(SDPBackend, backend.upper())]):
            return fn(*args)
    except RuntimeError as exc:  # this backend does not take these inputs
        pytest.skip(f"{backend} refused: {str(exc).splitlines()[0][:120]}")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=["minicpm4", "qwen35"])
@pytest.mark.parametrize("prefix", [0, 100])
def test_causal_sdpa_on_projection_views_matches_float32(geometry, backend, prefix):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    H, Hkv, D = geometry
    T, dev = 1000, torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    # the layouts a layer produces: q from a [T, H·D] projection viewed as [T, H, D]; k, v from [S, Hkv·D]
    q = torch.randn(T, H * D, device=dev, generator=gen, dtype=torch.bfloat16).view(T, H, D)
    S = prefix + T
    k, v = (torch.randn(S, Hkv * D, device=dev, generator=gen, dtype=torch.bfloat16).view(S, Hkv, D)
            .transpose(0, 1)[None] for _ in range(2))  # fmt: skip
    want = _reference(q, k, v, prefix)
    got = _under_backend(backend, causal_sdpa, q, k, v, prefix)
    assert got.shape == (T, H, D)
    assert rel_err(got.float(), want) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=["minicpm4", "qwen35"])
def test_grouped_decode_matches_float32_on_the_gpu(geometry, backend):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    H, Hkv, D = geometry
    gen = torch.Generator(device="cuda").manual_seed(2)
    q, k, v, mask = _decode_inputs(16, H, Hkv, D, 3000, "cuda", torch.bfloat16, gen)
    want = _decode_reference(q, k, v, mask)
    got = _under_backend(backend, grouped_decode_sdpa, q, k, v, mask)
    assert rel_err(got.float(), want) < 2e-2
