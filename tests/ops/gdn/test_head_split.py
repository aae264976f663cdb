"""SparseGDN over a share of a layer's heads (``head_split``, what a tensor-parallel rank runs) gives that share of
one call over every head — the same selection, outputs, states and stats — while a call that selected alone would
not. The ranks are simulated by threads of this process that take turns (one runs at a time; the gather hands over
between them), both on the torch specification and on the Triton kernels (in the interpreter on the CPU)."""

import dataclasses
import threading

import pytest
import torch

from longsparse.ops._triton import kernels_can_run_on
from longsparse.ops.gdn import SparseGDNKernelConfig, sparse_chunk_gated_delta_rule
from longsparse.ops.gdn.heads import HeadSplit
from tests.helpers import rel_err
from tests.ops.gdn.helpers import make_gate, make_gdn_inputs, spread_decays

H, HV, K, V = 4, 8, 16, 16
LENGTHS = [64 * 11 + 5, 64 * 6]
SHORT = [64 * 5 + 5, 64 * 3]
"""The kernel test's lengths (the interpreter runs each call for seconds)."""


class TakingTurns:
    """``fn(rank, split)`` on ``size`` threads, one running at a time; ``split`` is the rank's :class:`HeadSplit` of
    ``HV`` heads, whose gather waits for every rank's part."""

    def __init__(self, size: int):
        self.size = size
        self.turn = threading.Lock()
        self.barrier = threading.Barrier(size)
        self.parts: list = [None] * size

    def run(self, fn) -> list:
        results, errors = [None] * self.size, []

        def main(rank):
            with self.turn:
                try:
                    share = HV // self.size
                    results[rank] = fn(
                        rank, HeadSplit(rank * share, share, HV, lambda x, dim: self._gather(rank, x, dim))
                    )
                except BaseException as exc:  # noqa: BLE001 - the test reports it
                    errors.append(exc)
                    self.barrier.abort()

        threads = [threading.Thread(target=main, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        if errors:
            raise errors[0]
        return results

    def _gather(self, rank: int, x: torch.Tensor, dim: int) -> torch.Tensor:
        self.parts[rank] = x
        self._wait()
        out = torch.cat(self.parts, dim)
        self._wait()  # nobody overwrites a part before every rank has read them all
        return out

    def _wait(self):
        self.turn.release()
        try:
            self.barrier.wait(timeout=600)
        finally:
            self.turn.acquire()


def _inputs(dtype, device="cpu", lengths=LENGTHS):
    T = sum(lengths)
    q, k, v, _, beta, h0 = make_gdn_inputs(1, T, H, HV, K, V, with_state=True, n_states=len(lengths), seed=3)
    g = spread_decays(1, T, HV, seed=3)
    gate, w = make_gate(1, T, HV, V, seed=4)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    return [x.to(device, dtype) for x in (q, k, v, g, beta, h0, gate)], w.to(device, dtype), cu.to(device)


def _call(inputs, w, cu, kernel_config, heads: slice, head_split=None):
    q, k, v, g, beta, h0, gate = inputs
    group = HV // H
    qk = slice(heads.start // group, heads.stop // group)
    return sparse_chunk_gated_delta_rule(
        q[:, :, qk], k[:, :, qk], v[:, :, heads], g[:, :, heads], beta[:, :, heads], initial_state=h0[:, heads],
        output_final_state=True, cu_seqlens=cu, gate=gate[:, :, heads], gate_norm_weight=w, kernel_config=kernel_config,
        return_stats=True, head_split=head_split,
    )  # fmt: skip


def _check_split_equals_whole(dtype, config, tol, ranks=2, device="cpu", lengths=LENGTHS):
    inputs, w, cu = _inputs(dtype, device, lengths)
    o, state, stats = _call(inputs, w, cu, config, slice(0, HV))
    share = HV // ranks
    parts = TakingTurns(ranks).run(
        lambda r, split: _call(inputs, w, cu, config, slice(r * share, (r + 1) * share), split)
    )
    assert rel_err(torch.cat([p[0] for p in parts], 2), o) <= tol
    assert rel_err(torch.cat([p[1] for p in parts], 1), state) <= tol
    for _, _, part_stats in parts:
        assert torch.equal(part_stats.mask.cpu(), stats.mask.cpu())
        assert torch.equal(part_stats.tiers.cpu(), stats.tiers.cpu())
        assert part_stats.keep_ratio == stats.keep_ratio
    # shares that select alone choose other events (on the specification, which selects as the kernels do)
    torch_config = dataclasses.replace(config, backend="torch")
    parts = [_call(inputs, w, cu, torch_config, slice(r * share, (r + 1) * share)) for r in range(ranks)]
    assert rel_err(torch.cat([p[0] for p in parts], 2).cpu(), o.cpu()) > 1e-3, "these inputs must need the exchange"
    return stats


@pytest.mark.parametrize("ranks", [2, 4])
def test_spec_over_a_share_of_the_heads_gives_that_share_of_the_whole_call(ranks):
    stats = _check_split_equals_whole(torch.float64, SparseGDNKernelConfig(backend="torch"), 1e-12, ranks)
    assert 0 < stats.keep_ratio < 1


@pytest.mark.slow
@pytest.mark.skipif(not kernels_can_run_on(torch.device("cpu")) and not torch.cuda.is_available(),
                    reason="Triton kernels cannot run here (no GPU and no interpreter)")  # fmt: skip
def test_kernels_over_a_share_of_the_heads_give_that_share_of_the_whole_call():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = SparseGDNKernelConfig(backend="triton")
    _check_split_equals_whole(torch.float32, config, 1e-5, device=device, lengths=SHORT)


def test_a_head_split_must_hold_the_calls_heads_as_whole_pairs():
    inputs, w, cu = _inputs(torch.float64)

    def gather(x, dim):
        return x

    with pytest.raises(ValueError, match="holds 4 value heads but the call has 8"):
        _call(inputs, w, cu, SparseGDNKernelConfig(backend="torch"), slice(0, HV), HeadSplit(0, 4, 8, gather))
    with pytest.raises(ValueError, match="splits a pair of 2 value heads"):
        _call(inputs, w, cu, SparseGDNKernelConfig(backend="torch"), slice(0, HV), HeadSplit(1, 8, 16, gather))
    with pytest.raises(ValueError, match="do not lie in"):
        HeadSplit(6, 4, 8, gather)
