"""The peers' adapters and bundles on the CPU: FlashInfer's GDN prefill called with FLA's arguments (checked against
a stand-in that keeps FlashInfer's documented conventions), bundles written in parts and joined again, and the
folders an installed bundle puts on PYTHONPATH."""

import zipfile

import pytest
import torch

from longsparse.bench import peers
from longsparse.ops.gdn import naive_recurrent_gated_delta_rule


def _flashinfer_stand_in(calls):
    """A function with ``flashinfer.gdn_prefill.chunk_gated_delta_rule``'s conventions: packed ``[T, heads, D]``
    tokens with ``cu_seqlens`` (required), ``g`` the decay factor itself (float32, in (0, 1]), ``beta`` float32,
    states ``[N, HV, V, K]`` float32; returns ``output`` or ``(output, final_state)``. It asserts those conventions
    and computes with the float64 token-by-token reference."""

    def op(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
           max_seqlen=None):  # fmt: skip
        calls.append(dict(max_seqlen=max_seqlen, cu_seqlens=cu_seqlens))
        assert q.dim() == k.dim() == v.dim() == 3 and all(x.is_contiguous() for x in (q, k, v))
        assert cu_seqlens is not None and cu_seqlens.dtype in (torch.int32, torch.int64)
        assert g.dtype == beta.dtype == torch.float32 and g.shape == beta.shape == v.shape[:2]
        assert bool((g > 0).all()) and bool((g <= 1).all()), "FlashInfer takes the decay factor, not its log"
        N, HV, V, K = len(cu_seqlens) - 1, v.shape[1], v.shape[2], q.shape[2]
        h0 = None
        if initial_state is not None:
            assert initial_state.dtype == torch.float32 and initial_state.shape == (N, HV, V, K)
            h0 = initial_state.transpose(-1, -2).double()
        o, state = naive_recurrent_gated_delta_rule(
            q[None].double(), k[None].double(), v[None].double(), g[None].double().log(), beta[None].double(),
            scale=scale, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens.long(),
        )  # fmt: skip
        o = o[0].to(q.dtype)
        return (o, state.transpose(-1, -2).float()) if output_final_state else o

    return op


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
def test_flashinfer_adapter_takes_and_returns_flas_conventions(with_state):
    """B = 2 sequences of T = 37 tokens, 2 qk heads and 4 value heads (K = 8, V = 6: a transposed state cannot pass):
    the adapter's output and final state equal FLA's conventions computed directly, and it passes FlashInfer one
    sequence per batch row (``cu_seqlens`` [0, 37, 74], ``max_seqlen`` 37)."""
    gen = torch.Generator().manual_seed(5)
    B, T, H, HV, K, V = 2, 37, 2, 4, 8, 6
    q = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen, dtype=torch.float64)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, generator=gen, dtype=torch.float64) + 2)
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=gen, dtype=torch.float64))
    h0 = torch.randn(B, HV, K, V, generator=gen, dtype=torch.float64) if with_state else None
    calls = []
    o, state = peers._flashinfer_gdn(_flashinfer_stand_in(calls), q, k, v, g, beta, scale=0.3,
                                     initial_state=h0, output_final_state=True)  # fmt: skip
    want_o, want_state = naive_recurrent_gated_delta_rule(q, k, v, g, beta, scale=0.3, initial_state=h0,
                                                          output_final_state=True)  # fmt: skip
    assert o.shape == (B, T, HV, V) and state.shape == (B, HV, K, V)
    assert torch.allclose(o, want_o, rtol=1e-5, atol=1e-6)  # g and beta go through float32
    assert torch.allclose(state.double(), want_state, atol=1e-5)  # FlashInfer's states are float32
    assert calls[0]["cu_seqlens"].tolist() == [0, T, 2 * T] and calls[0]["max_seqlen"] == T
    o_only, none = peers._flashinfer_gdn(_flashinfer_stand_in(calls), q, k, v, g, beta, scale=0.3, initial_state=h0)
    assert none is None and torch.equal(o_only, o)


def test_flashinfer_adapter_passes_given_cu_seqlens_through():
    """Varlen (B = 1, ``cu_seqlens`` given): the sequences stay separate, as in FLA's call."""
    gen = torch.Generator().manual_seed(6)
    T, H, HV, K, V = 50, 1, 2, 4, 4
    q = torch.randn(1, T, H, K, generator=gen, dtype=torch.float64)
    k = torch.nn.functional.normalize(torch.randn(1, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(1, T, HV, V, generator=gen, dtype=torch.float64)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, generator=gen, dtype=torch.float64) + 2)
    beta = torch.sigmoid(torch.randn(1, T, HV, generator=gen, dtype=torch.float64))
    cu = torch.tensor([0, 13, 50])
    calls = []
    o, state = peers._flashinfer_gdn(_flashinfer_stand_in(calls), q, k, v, g, beta, output_final_state=True,
                                     cu_seqlens=cu)  # fmt: skip
    want_o, want_state = naive_recurrent_gated_delta_rule(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu)
    assert torch.allclose(o, want_o, rtol=1e-5, atol=1e-6) and torch.allclose(state.double(), want_state, atol=1e-5)
    assert calls[0]["cu_seqlens"] is cu and calls[0]["max_seqlen"] is None


def test_a_missing_peer_says_why(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "flashinfer", None)
    fn, reason = peers.load_peer("flashinfer")
    assert fn is None and reason.startswith("import flashinfer.gdn_prefill failed: ModuleNotFoundError")
    assert peers.flashinfer_chunk_gated_delta_rule() is None


def test_a_bundle_in_parts_installs_like_one_file(tmp_path):
    """``part_bytes``: the bundle is split into files of at most that size, which ``install`` joins in order; pruned
    folders (FlashInfer's JIT sources) are left out; a ``.pth`` folder of the CuTe DSL is named for PYTHONPATH."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    blob = torch.randint(0, 256, (300_000,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    with zipfile.ZipFile(wheels / "flashinfer_python-1-py3-none-any.whl", "w") as z:
        z.writestr("flashinfer/__init__.py", "")
        z.writestr("flashinfer/gdn_prefill.py", "x = 1\n")
        z.writestr("flashinfer/data/csrc/kernel.cu", "// JIT source\n")
        z.writestr("flashinfer/data/build_utils.py", "")
        z.writestr("flashinfer/blob.bin", blob.numpy().tobytes())  # incompressible: several parts
    with zipfile.ZipFile(wheels / "nvidia_cutlass_dsl-1-py3-none-any.whl", "w") as z:
        z.writestr("nvidia_cutlass_dsl/dsl_packages/cutlass/__init__.py", "")
        z.writestr(
            "nvidia_cutlass_dsl_packages.pth",
            "import sys, os, nvidia_cutlass_dsl; sys.path.insert(0, os.path.join(nvidia_cutlass_dsl.__path__[0], "
            "'dsl_packages'))",
        )
    parts = peers.bundle(wheels, tmp_path / "fi.tar.xz", part_bytes=100_000)
    assert len(parts) >= 3 and all(p.stat().st_size <= 100_000 for p in parts)
    assert [p.name for p in parts] == sorted(p.name for p in parts) and not (tmp_path / "fi.tar.xz").exists()
    site = peers.install(parts, tmp_path / "site")
    assert (site / "flashinfer" / "blob.bin").read_bytes() == blob.numpy().tobytes()
    assert (site / "flashinfer" / "data" / "build_utils.py").exists()
    assert not (site / "flashinfer" / "data" / "csrc").exists()
    assert peers.import_paths(site) == [site, site / "nvidia_cutlass_dsl" / "dsl_packages"]
    with pytest.raises(FileNotFoundError, match="part99"):
        peers.install([*parts, tmp_path / "fi.tar.xz.part99"], tmp_path / "other")
