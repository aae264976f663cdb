"""`longsparse bench gdn`: SparseGDN prefill against the fastest dense GDN kernels, side by side in one process.

Qwen3.5-4B GDN geometry (H = 16 qk heads, HV = 32 value heads, K = V = 128), bf16, q/k L2-normalised,
``g = logsigmoid(N(shift, 1))`` (default shift 4: mean per-token retention ≈ 0.98), ``beta = sigmoid(N(0, 1))``, and an
output gate z ~ N(0, 1) for the selector's visibility factor. Peers: FLA's Triton ``chunk_gated_delta_rule`` (its
FlashQLA dispatch off), FlashQLA and FlashInfer's GDN prefill (its CuTe-DSL kernels on Hopper, called as vLLM calls
it: :func:`~longsparse.bench.peers.flashinfer_chunk_gated_delta_rule`); a peer that does not import is recorded with
the reason (``peers_missing`` in each row). A checked row first checks ours against the torch specification on the
same mask (within the bf16 drift of the dense path) and every peer against the float32 dense reference, then times:
ours end to end (intra + selection + main pass), each stage, and the peers; and records the peak memory increment of
one call of each.

Rows are checked up to ``--check-max-tokens`` tokens and at the lengths the summary quotes (:data:`QUOTED_LENGTHS`,
B = 1), whatever their size; a row's ``passed`` is absent when it was not checked, and the summary quotes a speedup
only from a row whose check passed (and against a peer whose own check passed).

The GDN core of a 24-layer forward pass is measured too (``<name>_24_layers_ms``: 24 calls back to back, the host
issuing a layer while the GPU runs the previous one, on two alternating input sets), not multiplied out.

The row's end-to-end calls (ours, planned ours, each peer) are timed side by side, in interleaved rounds
(``bench.timing.benchmark_side_by_side``), so that the host's drift on a shared machine falls on all of them alike.
"ours" is timed twice: as a plain op call (``ours_ms``: no plan passed — the op keeps one plan per batch shape,
``launch.batch_plan``, so repeated calls over one shape plan once, as FLA keeps its chunk indices) and as a layer of
a model (``ours_planned_ms``: the launch plan built by the caller and shared, as our GDN layers share it within a
forward pass); the stages are timed with the shared plan, the selection as the op runs it (mask only).

Ours is called as the model's GDN layers call it, with ``bounded_inputs=True`` (the inputs' β is a sigmoid and the
keys are unit; ``--bounded-inputs off`` times the form that tests each chunk's range instead).

``--main-pass walk,csr`` runs both main passes of ours in the same process (each checked against the specification,
each timed end to end and as a stage); the first one listed is "ours" in the summary, the table and the plot.
"""

from __future__ import annotations

import dataclasses
import gc

import torch

from ..ops.gdn import (
    SparseGDNConfig,
    SparseGDNKernelConfig,
    naive_chunk_gated_delta_rule,
    sparse_chunk_gated_delta_rule,
)
from ..ops.gdn.config import BLOCK_VS, MAIN_PASSES, WALK_CORRECTIONS, WALK_KERNELS, WALK_SCORES, WARPS
from ..ops.gdn.launch import GLUON_MIN_CHUNKS, resolve_walk
from ..reports.results import BenchmarkResult, RowLog
from ..reports.tables import format_table, ratio
from .peers import load_peer
from .timing import benchmark, benchmark_side_by_side, gbps, host_issue_ms, peak_memory_increment

H, HV, D = 16, 32, 128
LAYERS = 24
HBM_TBPS = 4.25
DEFAULT_LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)
DEFAULT_BATCHES = (2, 4, 8)
BATCH_LENGTH = 32768
CHECK_MAX_TOKENS = 16384
"""Rows of at most this many tokens (B·T) are checked (``--check-max-tokens``)."""
QUOTED_LENGTHS = (4096, 32768, 131072)
"""The B = 1 lengths the summary quotes: checked whatever ``--check-max-tokens`` says."""
PEERS = ("fla", "flashqla", "flashinfer")
PEER_LABELS = {"fla": "FLA (Triton)", "flashqla": "FlashQLA (TileLang)", "flashinfer": "FlashInfer (CuTe DSL)"}
ROUNDS = 5
"""Interleaved rounds of a row's end-to-end timings (``--rounds``)."""


def make_inputs(B: int, T: int, shift: float, seed: int = 0, device="cuda"):
    """Random bf16 inputs at the Qwen3.5 GDN geometry: ``(q, k, v, g, beta, gate, gate_norm_weight)``."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=gen)

    q = torch.nn.functional.normalize(randn(B, T, H, D), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(randn(B, T, H, D), dim=-1).bfloat16()
    v = randn(B, T, HV, D).bfloat16()
    g = torch.nn.functional.logsigmoid(randn(B, T, HV) + shift)
    beta = torch.sigmoid(randn(B, T, HV))
    gate = randn(B, T, HV, D).bfloat16()
    weight = 0.5 + torch.rand(D, device=device, generator=gen)
    return q, k, v, g, beta, gate, weight


ALIKE_SPREAD = 0.1
"""Spread of the benchmark's alike keys (:func:`alike_keys`): cosine ~0.99 between keys of one head."""


def alike_keys(k: torch.Tensor, spread: float = ALIKE_SPREAD, seed: int = 0) -> torch.Tensor:
    """Unit keys gathered around one random direction per head, ``normalize(base + spread · noise)``, in ``k``'s
    shape, dtype and device: as alike as trained models' keys often are, where the chunk inverse's alternating terms
    cancel and a bf16 kernel loses the most (random unit keys never show it)."""
    gen = torch.Generator(device=k.device).manual_seed(seed)
    B, T, Hk, Dk = k.shape
    base = torch.randn(1, 1, Hk, Dk, device=k.device, generator=gen)
    noise = torch.randn(B, T, Hk, Dk, device=k.device, generator=gen)
    return torch.nn.functional.normalize(base + spread * noise, dim=-1).to(k.dtype)


def floor_bytes(B: int, T: int) -> int:
    """The fewest bytes a GDN prefill moves: q, k, v read once, o written once (bf16; g and beta are small)."""
    return 2 * B * T * (2 * H * D + 2 * HV * D)


def stage_bytes(
    B: int, T: int, NC: int, sequences: int, scores_rows: int | None, kept_ct: bool, ct_only: bool = False
) -> dict:
    """Bytes each stage of ours moves through HBM (bf16 q/k/v/o and coefficients, fp32 g, beta and states): the
    traffic behind the stages' achieved bandwidth (``floor_bytes`` is the op's minimum, not what it moves).

    Intra reads k, v's rows 32-63 of every chunk (the tail score's), g and beta, and q where it stores the walk's
    scores into ``[NC, HV, scores_rows, 64]`` tiles (64: the scores ``A``; 128: then the dense ``Ct``, its only copy
    on the Gluon path; None: no tiles); it writes the tiles and, with ``kept_ct``, the 7 kept 16×16 blocks of Ct.
    ``ct_only`` (128-row tiles, a Gluon walk forming its scores itself): intra reads no q and writes, and the main
    pass reads, only the tiles' Ct rows. The main pass reads q, k, v, g, the tiles and the kept blocks it has, and
    writes o and the final states. Left
    out: the entry kernel's warm-up re-reads, the selector's per-chunk buffers (KiB) and the tiny γ and tail scores.
    """
    n = B * T
    q = k = n * H * D * 2
    v = o = n * HV * D * 2
    g = n * HV * 4
    rows = 64 if ct_only else scores_rows
    tiles = NC * HV * rows * 64 * 2 if rows else 0
    kept = NC * HV * 7 * 256 * 2 if kept_ct else 0
    intra = k + v // 2 + 2 * g + (q if scores_rows and not ct_only else 0) + tiles + kept
    main = q + k + v + g + tiles + kept + o + sequences * HV * D * D * 4
    return {"intra": intra, "main": main}


def variant(cfg: SparseGDNKernelConfig) -> str:
    """The name of a main-pass variant in the row keys: the pass, then the walk's correction form, its value tile
    and warps where they differ from :class:`SparseGDNKernelConfig`'s defaults."""
    default = SparseGDNKernelConfig()
    name = cfg.main_pass
    if cfg.main_pass == "walk" and cfg.walk_correction != default.walk_correction:
        name = f"{name}_{cfg.walk_correction}"
    if cfg.main_pass == "walk" and cfg.walk_scores != default.walk_scores:
        name = f"{name}_{cfg.walk_scores}"
    if cfg.main_pass == "walk" and cfg.walk_kernel != default.walk_kernel:
        name = f"{name}_{cfg.walk_kernel}"
    if cfg.main_pass == "walk" and cfg.walk_output_role != default.walk_output_role:
        name = f"{name}_role" if cfg.walk_output_role else f"{name}_norole"
    name = name if cfg.block_v == default.block_v else f"{name}_bv{cfg.block_v}"
    return name if cfg.main_warps == default.main_warps else f"{name}_w{cfg.main_warps}"


def _check(q, k, v, g, beta, gate, w, cfgs: list[SparseGDNKernelConfig], bounded: bool, peers: dict) -> dict:
    """Ours (every main pass in ``cfgs``, the first one as "ours") vs the specification (fp32, same mask) and FLA's
    own drift from the fp32 dense reference — on the row's inputs and again with alike keys (:func:`alike_keys`;
    keys ``_alike``): ours must stay within twice FLA's drift on both (at least 1e-2 on the row's inputs). Every peer
    of ``peers`` is checked on the row's inputs against the same fp32 dense reference (``<peer>_vs_dense_rel``,
    ``<peer>_passed``: within the same tolerance), so that no ratio is taken against a peer that computed something
    else."""
    out = _check_inputs(q, k, v, g, beta, gate, w, cfgs, bounded, peers)
    fla = {"fla": peers["fla"]} if "fla" in peers else {}
    alike = _check_inputs(q, alike_keys(k), v, g, beta, gate, w, cfgs[:1], bounded, fla)
    out["ours_vs_spec_rel_alike"] = alike["ours_vs_spec_rel"]
    if "fla_vs_dense_rel" in alike:
        out["fla_vs_dense_rel_alike"] = alike["fla_vs_dense_rel"]
    out["tolerance_alike"] = 2 * alike.get("fla_vs_dense_rel", 1e-2)
    out["passed"] = out["passed"] and out["ours_vs_spec_rel_alike"] <= out["tolerance_alike"]
    return out


def _check_inputs(q, k, v, g, beta, gate, w, cfgs: list[SparseGDNKernelConfig], bounded: bool, peers: dict) -> dict:
    """:func:`_check` on one set of inputs (the peers of ``peers`` against the dense reference)."""
    from ..ops.gdn.launch import run_kernels
    from ..ops.gdn.spec.pipeline import run_spec

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    rep = HV // H
    qe, ke = (x.float().repeat_interleave(rep, 2) for x in (q, k))
    trace = run_spec(
        qe,
        ke,
        v.float(),
        g,
        beta,
        group=rep,
        scale=D**-0.5,
        config=SparseGDNConfig(),
        gate=gate.float(),
        gate_norm_weight=w,
    )
    dense32, _ = naive_chunk_gated_delta_rule(q.float(), k.float(), v.float(), g, beta)
    out = {}
    for cfg in cfgs:
        mask = trace.selection.mask
        kw = dict(gate=gate, gate_norm_weight=w, kernel_config=cfg, mask=mask, bounded_inputs=bounded)
        o = run_kernels(q, k, v, g, beta, **kw)[0]
        out[f"{variant(cfg)}_vs_spec_rel"] = rel(o, trace.o)
        out[f"{variant(cfg)}_vs_dense_rel"] = rel(o, dense32)
    out["ours_vs_spec_rel"] = out[f"{variant(cfgs[0])}_vs_spec_rel"]
    out["ours_vs_dense_rel"] = out[f"{variant(cfgs[0])}_vs_dense_rel"]
    for name, fn in peers.items():
        try:
            peer_o = fn(q, k, v, g, beta, output_final_state=True)[0]
        except Exception as exc:  # a peer failing at run time (a JIT build, say) is recorded; the row goes on
            out[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            continue
        out[f"{name}_vs_dense_rel"] = rel(peer_o, dense32)
        del peer_o
    drift = out.get("fla_vs_dense_rel", 1e-2)
    out["tolerance"] = max(2 * drift, 1e-2)
    out["passed"] = all(out[f"{variant(cfg)}_vs_spec_rel"] <= out["tolerance"] for cfg in cfgs)
    for name in peers:
        out[f"{name}_passed"] = out.get(f"{name}_vs_dense_rel", float("inf")) <= out["tolerance"]
    own = run_kernels(q, k, v, g, beta, gate=gate, gate_norm_weight=w, kernel_config=cfgs[0], bounded_inputs=bounded)[2]
    out["selection_agreement"] = (own.mask == trace.selection.mask).float().mean().item()
    return out


def _stage_times(q, k, v, g, beta, gate, w, cfgs: list[SparseGDNKernelConfig], bounded: bool) -> dict:
    """Median time of each stage of ours, each timed alone with the previous stages' results as inputs; the main
    pass once per config (``main_<pass>_ms``; ``main_ms`` is the first config's). As in the op, intra stores the
    intra-chunk scores where the walk reads them (its time includes them, the main pass's does not)."""
    from ..ops.gdn import launch
    from ..ops.gdn.intra import intra_forward

    B, T = q.shape[:2]
    plan = launch.plan_launch(B, T, None, q.device)  # as in a model: planned once, shared by the layers
    layout, bos, clen, lengths = plan.layout, plan.chunk_bos, plan.chunk_len, plan.lengths
    kf, vf = k.reshape(B * T, H, D), v.reshape(B * T, HV, D)
    gf, bf = g.reshape(B * T, HV), beta.reshape(B * T, HV)
    cfg = cfgs[0]
    qf = q.reshape(B * T, H, D)
    # as the op runs it: intra stores the intra-chunk scores (and the Gluon walk's dense Ct, its only copy then)
    # where the walk reads them
    walk = launch.resolve_walk(cfg, qf, vf, layout.NC)
    ct_op, gamma, score, scores = launch.run_intra(cfg, walk, qf, kf, vf, gf, bf, bos, clen, bounded)
    reads = scores is not None
    ct = intra_forward(kf, vf, gf, bf, bos, clen, max_registers=cfg.intra_registers)[0]  # for every config's pass
    method = SparseGDNConfig()
    sel, prefix = launch.run_selection(  # as the op runs it
        plan, score, gamma, H, method, gate, w, details=False, kernel_config=cfg
    )
    other_warps = 8 if cfg.intra_warps == 4 else 4  # the intra kernel's spills differ with its warps: time both

    def intra(warps):
        return launch.run_intra(
            dataclasses.replace(cfg, intra_warps=warps), walk, qf, kf, vf, gf, bf, bos, clen, bounded
        )

    times = {
        "intra_ms": benchmark(lambda: intra(cfg.intra_warps)).median_ms,
        f"intra_w{other_warps}_ms": benchmark(lambda: intra(other_warps)).median_ms,
        "select_ms": benchmark(
            lambda: launch.run_selection(plan, score, gamma, H, method, gate, w, details=False, kernel_config=cfg)
        ).median_ms,
    }

    def main_pass(c, given):
        args = (qf, kf, vf, gf, ct, gamma, sel, layout, lengths, bos, clen, None, D**-0.5, method, c)
        return launch._main_pass(*args, plan=plan, prefix=prefix, scores=given)

    # a config whose walk reads another layout of stored scores forms its own (timed with it); so does one that
    # reads the scores where the first config's Gluon walk forms them (its tiles then hold the Ct rows alone)
    ct_only = walk[0] == "gluon" and launch.gluon_forms_scores(cfg)
    for c in cfgs:
        wanted = launch.scores_buffer(c, qf, vf, layout.NC)
        same = reads and wanted is not None and wanted.shape == scores.shape
        given = scores if same and not (ct_only and not launch.gluon_forms_scores(c)) else None
        times[f"main_{variant(c)}_ms"] = benchmark(lambda c=c, given=given: main_pass(c, given)).median_ms
    times["main_ms"] = times[f"main_{variant(cfg)}_ms"]
    times["keep_ratio"] = sel.mask.sum().item() / (H * layout.NC)
    # the first config's traffic (its intra as the op runs it, its pass on the tiles it reads)
    moved = stage_bytes(
        B, T, layout.NC, B, scores.shape[2] if reads else None, kept_ct=ct_op is not None, ct_only=ct_only
    )
    times["intra_gbps"] = gbps(moved["intra"], times["intra_ms"])
    times["main_gbps"] = gbps(moved["main"], times["main_ms"])
    times["moved_gb"] = (moved["intra"] + moved["main"]) / 1e9
    return times


def _stack_times(inputs, shift, plan, gate, w, cfg: SparseGDNKernelConfig, peers: dict, bounded: bool) -> dict:
    """``<name>_24_layers_ms``: the GDN core of a 24-layer forward pass, measured — :data:`LAYERS` calls issued back
    to back on two alternating input sets (no layer finds the previous one's inputs in L2), ours with the plan
    shared as a model shares it; timed side by side with the peers. Unlike 24 times one call, the host issues a
    layer while the GPU runs the one before, as in a model. ``inputs``: the row's ``(q, k, v, g, beta)``, the first
    set."""
    B, T = inputs[0].shape[:2]
    sets = [inputs, make_inputs(B, T, shift, seed=1)[:5]]

    def ours():
        for i in range(LAYERS):
            q, k, v, g, beta, *_ = sets[i % 2]
            sparse_chunk_gated_delta_rule(
                q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, kernel_config=cfg,
                plan=plan, bounded_inputs=bounded,
            )  # fmt: skip

    def peer(fn):
        def stack():
            for i in range(LAYERS):
                q, k, v, g, beta, *_ = sets[i % 2]
                fn(q, k, v, g, beta, output_final_state=True)

        return stack

    stacks = {"ours": ours, **{name: peer(fn) for name, fn in peers.items()}}
    timings = benchmark_side_by_side(stacks, rounds=3)
    out = {f"{name}_24_layers_ms": t.median_ms for name, t in timings.items()}
    for name in peers:
        out[f"speedup_24_layers_vs_{name}"] = ratio(out[f"{name}_24_layers_ms"], out["ours_24_layers_ms"])
    return out


def run_case(
    B: int,
    T: int,
    shift: float,
    peers: dict,
    check: bool,
    cfgs: list[SparseGDNKernelConfig],
    bounded: bool = True,
    rounds: int = ROUNDS,
) -> dict:
    """One (B, T) row: ours with every config of ``cfgs`` (the first is "ours"), its stages, and the peers;
    ``check``: check ours and the peers first (:func:`_check`); ``bounded``: ours called with ``bounded_inputs`` (as
    a model's layer calls it); ``rounds``: the interleaved rounds of the end-to-end timings."""
    row = {"B": B, "T": T, "main_pass": variant(cfgs[0]), "bounded_inputs": bounded}
    q, k, v, g, beta, gate, w = make_inputs(B, T, shift)
    if check:
        row.update(_check(q, k, v, g, beta, gate, w, cfgs, bounded, peers))
        gc.collect()
        torch.cuda.empty_cache()  # the fp32 references of a long row are GiBs
        peers = {name: fn for name, fn in peers.items() if f"{name}_error" not in row}
    row["correctness_checked"] = row.get("passed") is True

    from ..ops.gdn.launch import plan_launch

    shared = plan_launch(B, T, None, q.device)
    calls = {}  # every timed call of the row, timed side by side (interleaved rounds)
    for cfg in cfgs:

        def ours(cfg=cfg, plan=None):
            return sparse_chunk_gated_delta_rule(
                q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, kernel_config=cfg,
                plan=plan, bounded_inputs=bounded,
            )  # fmt: skip

        ours()
        calls[f"ours_{variant(cfg)}"] = ours
        # a model's layer: the launch plan is built by the first GDN layer of the pass and shared by the rest
        ours(plan=shared)
        calls[f"ours_planned_{variant(cfg)}"] = lambda ours=ours: ours(plan=shared)
    for name, fn in peers.items():
        call = lambda fn=fn: fn(q, k, v, g, beta, output_final_state=True)  # noqa: E731
        try:
            call()
            calls[name] = call
        except torch.cuda.OutOfMemoryError:
            row[f"{name}_ms"] = None
            row[f"{name}_note"] = "OOM"
            torch.cuda.empty_cache()
        except Exception as exc:  # recorded, as in the check: the other calls of the row are still timed
            row[f"{name}_ms"] = None
            row[f"{name}_note"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    for name, t in benchmark_side_by_side(calls, rounds=rounds).items():
        row[f"{name}_ms"] = t.median_ms
        row[f"{name}_spread"] = t.spread  # over the interleaved rounds
    timed_peers = {name: fn for name, fn in peers.items() if name in calls}
    row.update(_stack_times((q, k, v, g, beta), shift, shared, gate, w, cfgs[0], timed_peers, bounded))
    for cfg in cfgs:
        row[f"ours_{variant(cfg)}_peak_gib"] = peak_memory_increment(calls[f"ours_{variant(cfg)}"]) / 2**30
    # the host's share: where it exceeds the device time, the call is host-bound
    row["ours_host_ms"] = host_issue_ms(calls[f"ours_{variant(cfgs[0])}"])
    row["ours_ms"] = row[f"ours_{variant(cfgs[0])}_ms"]
    row["ours_planned_ms"] = row[f"ours_planned_{variant(cfgs[0])}_ms"]
    row["ours_peak_gib"] = row[f"ours_{variant(cfgs[0])}_peak_gib"]
    for name in peers:
        if name in calls:
            row[f"{name}_host_ms"] = host_issue_ms(calls[name])
            row[f"{name}_peak_gib"] = peak_memory_increment(calls[name]) / 2**30
            torch.cuda.empty_cache()
    row.update(_stage_times(q, k, v, g, beta, gate, w, cfgs, bounded))
    row["ours_gbps"] = gbps(floor_bytes(B, T), row["ours_ms"])
    for name in peers:
        row[f"speedup_vs_{name}"] = ratio(row.get(f"{name}_ms"), row["ours_ms"])
        row[f"planned_speedup_vs_{name}"] = ratio(row.get(f"{name}_ms"), row["ours_planned_ms"])
    return row


def peer_versions(names) -> dict:
    """The installed version of each peer in ``names`` (distribution metadata; None if absent)."""
    from importlib import metadata

    dists = {"fla": "fla-core", "flashqla": "flash-qla", "flashinfer": "flashinfer-python"}
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(dists[name])
        except metadata.PackageNotFoundError:
            out[name] = None
    if "flashinfer" in names:
        try:
            out["nvidia-cutlass-dsl"] = metadata.version("nvidia-cutlass-dsl")
        except metadata.PackageNotFoundError:
            out["nvidia-cutlass-dsl"] = None
    return out


def configure(parser) -> None:
    parser.add_argument(
        "--lengths",
        default=",".join(str(t) for t in DEFAULT_LENGTHS),
        help="sequence lengths at B = 1 (default: %(default)s)",
    )
    parser.add_argument(
        "--batches",
        default=",".join(str(b) for b in DEFAULT_BATCHES),
        help=f"batch sizes at T = {BATCH_LENGTH} (default: %(default)s; empty for none)",
    )
    parser.add_argument("--shift", type=float, default=4.0, help="g = logsigmoid(N(shift, 1)) (default: %(default)s)")
    parser.add_argument("--name", default="gdn_core", help="result name (default: %(default)s)")
    parser.add_argument(
        "--append",
        action="store_true",
        help="keep the rows of an existing results file and replace those of the same (B, T), so that several "
        "runs (e.g. the lengths in one, the batches in another) build one file; each row records its run's date",
    )
    parser.add_argument(
        "--segment-chunks",
        type=int,
        default=None,
        help="chunks per parallel segment of the main pass (default: chosen per length)",
    )
    parser.add_argument(
        "--main-pass",
        default="walk",
        help=f"main pass(es) of ours, comma-separated, from {MAIN_PASSES}; the first is reported as ours "
        "(default: %(default)s; walk,csr compares both in one run)",
    )
    parser.add_argument(
        "--main-warps",
        default="4",
        help=f"warps of the main pass's programs, comma-separated, from {WARPS} (SparseGDNKernelConfig.main_warps); "
        "combined with every pass and tile (default: %(default)s; rows name the others '<pass>..._w<warps>')",
    )
    parser.add_argument(
        "--block-v",
        default="auto",
        help=f"value tile(s) of the main pass, comma-separated, from {BLOCK_VS} or 'auto' "
        "(SparseGDNKernelConfig.block_v None: the walk kernel's own); every main pass runs with each, the first pair "
        "is reported as ours (default: %(default)s; rows name the others '<pass>_bv<tile>')",
    )
    parser.add_argument(
        "--walk-correction",
        default=SparseGDNKernelConfig.walk_correction,
        help=f"the walk's correction form(s), comma-separated, from {WALK_CORRECTIONS} "
        "(SparseGDNKernelConfig.walk_correction; the csr pass has one form) (default: %(default)s; rows name the "
        "others 'walk_<form>')",
    )
    parser.add_argument(
        "--walk-scores",
        default=SparseGDNKernelConfig.walk_scores,
        help=f"where the walk's intra-chunk scores come from, comma-separated, from {WALK_SCORES} "
        "(SparseGDNKernelConfig.walk_scores) (default: %(default)s; rows name the others 'walk_<where>')",
    )
    parser.add_argument(
        "--walk-output-role",
        default="on" if SparseGDNKernelConfig.walk_output_role else "off",
        help="the Gluon walk's output role (SparseGDNKernelConfig.walk_output_role), comma-separated from off,on; "
        "every walk row runs with each (default: %(default)s; rows name the other 'walk_role' or 'walk_norole')",
    )
    parser.add_argument(
        "--walk-kernel",
        default=SparseGDNKernelConfig.walk_kernel,
        help=f"the walk's kernel(s), comma-separated, from {WALK_KERNELS} (SparseGDNKernelConfig.walk_kernel; one row "
        "per other kernel and --block-v, the other walk options at their defaults) (default: %(default)s; rows name "
        "the others 'walk_<kernel>')",
    )
    parser.add_argument(
        "--bounded-inputs",
        choices=("on", "off"),
        default="on",
        help="call ours with bounded_inputs (unit keys, |beta| <= 1: true of these inputs, and how the model's GDN "
        "layers call it); off times intra's per-chunk range test instead (default: %(default)s)",
    )
    parser.add_argument(
        "--peers",
        default=",".join(PEERS),
        help=f"dense peers to check and time, comma-separated, from {PEERS} (default: %(default)s); one that does not "
        "import is recorded with the reason",
    )
    parser.add_argument(
        "--check-max-tokens",
        type=int,
        default=CHECK_MAX_TOKENS,
        help="check every row of at most this many tokens (B·T); the summary's lengths "
        f"{', '.join(str(t) for t in QUOTED_LENGTHS)} at B = 1 are checked whatever it says (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=ROUNDS,
        help="interleaved rounds of each row's end-to-end timings (each row records every call's spread over them; "
        "more rounds tell a 1-2 %% difference from the run's noise) (default: %(default)s)",
    )


def choices(text: str, allowed: tuple, kind) -> list | None:
    """``"a,b"`` -> ``[kind(a), kind(b)]`` if they are distinct members of ``allowed`` (at least one), else None."""
    try:
        values = [kind(x) for x in text.split(",") if x]
    except ValueError:
        return None
    return values if values and len(set(values)) == len(values) and set(values) <= set(allowed) else None


def _tile(text: str) -> int | None:
    """A ``--block-v`` entry: ``"auto"`` -> None (``SparseGDNKernelConfig.block_v``'s default), else the tile."""
    return None if text == "auto" else int(text)


def run(args) -> int:
    if not torch.cuda.is_available():
        print("bench gdn needs a CUDA GPU (timings on a CPU would mean nothing)")
        return 2
    if args.rounds < 1:
        print(f"--rounds must be at least 1, got {args.rounds}")
        return 2
    passes = choices(args.main_pass, MAIN_PASSES, str)
    tiles = choices(args.block_v, (None, *BLOCK_VS), _tile)
    warps = choices(args.main_warps, WARPS, int)
    corrections = choices(args.walk_correction, WALK_CORRECTIONS, str)
    scores = choices(args.walk_scores, WALK_SCORES, str)
    kernels = choices(args.walk_kernel, WALK_KERNELS, str)
    roles = choices(args.walk_output_role, ("off", "on"), str)
    for flag, given, chosen, allowed in (
        ("--main-pass", args.main_pass, passes, MAIN_PASSES),
        ("--block-v", args.block_v, tiles, ("auto", *BLOCK_VS)),
        ("--main-warps", args.main_warps, warps, WARPS),
        ("--walk-correction", args.walk_correction, corrections, WALK_CORRECTIONS),
        ("--walk-scores", args.walk_scores, scores, WALK_SCORES),
        ("--walk-kernel", args.walk_kernel, kernels, WALK_KERNELS),
        ("--walk-output-role", args.walk_output_role, roles, ("off", "on")),
    ):
        if chosen is None:
            print(f"{flag} must list distinct values from {allowed}, got {given!r}")
            return 2
    wanted = choices(args.peers, PEERS, str)
    if wanted is None:
        print(f"--peers must list distinct values from {PEERS}, got {args.peers!r}")
        return 2
    peers, missing = {}, {}
    for name in wanted:
        fn, reason = load_peer(name)
        if fn is None:
            missing[name] = reason
        else:
            peers[name] = fn
    base = SparseGDNKernelConfig(segment_chunks=args.segment_chunks)
    cfgs = [
        dataclasses.replace(
            base, main_pass=p, walk_correction=c, walk_scores=a, block_v=bv, main_warps=w, walk_output_role=r == "on"
        )
        for p in passes
        for c in (corrections if p == "walk" else corrections[:1])
        for a in (scores if p == "walk" else scores[:1])
        for r in (roles if p == "walk" else ["off"])
        for bv in tiles
        for w in warps
    ]
    if "walk" in passes:  # the other walk kernels: one row per value tile, on the default Triton-walk settings
        other = [dataclasses.replace(base, walk_kernel=kind, block_v=bv) for kind in kernels for bv in tiles]
        other = [c for c in other if c.walk_kernel != base.walk_kernel]
        cfgs = other + cfgs if kernels[0] != base.walk_kernel else cfgs + other  # the first kernel named is "ours"
    names = [variant(c) for c in cfgs]
    log = RowLog(f"{args.out}/results", args.name, ("B", "T"), lambda rows: summarise(rows, names), args.append)
    log.note(
        f"Qwen3.5-4B GDN geometry H={H} HV={HV} K=V={D}, bf16, g=logsigmoid(N({args.shift},1)); ours = intra + "
        "selection + main pass (every stage of the op); peers with output_final_state=True. 24-layer times are "
        "measured (24 calls back to back, two alternating input sets). GB/s counts q, k, v read and o written once "
        f"(ceiling {HBM_TBPS} TB/s). Main passes: {passes}, value tiles {tiles} (ours = {passes[0]}, tile {tiles[0]}). "
        f"Ours with bounded_inputs={args.bounded_inputs == 'on'}."
    )
    log.note(f"peer versions: {peer_versions(wanted)}")
    for name, reason in missing.items():
        log.note(f"peer {name} missing: {reason}")
    probe_q = torch.empty(64, H, D, dtype=torch.bfloat16, device="cuda")
    kernel, tile = resolve_walk(cfgs[0], probe_q, torch.empty(64, HV, D, dtype=torch.bfloat16, device="cuda"))
    log.note(
        f"ours' main pass on this GPU: the {kernel} kernel, value tile {tile} (SparseGDNKernelConfig.walk_kernel="
        f"{cfgs[0].walk_kernel!r}, block_v={cfgs[0].block_v!r}; 'auto' takes the Triton walk below "
        f"{GLUON_MIN_CHUNKS} chunks per batch)"
    )
    cases = [(1, int(t)) for t in args.lengths.split(",") if t]
    cases += [(int(b), BATCH_LENGTH) for b in args.batches.split(",") if b]
    for B, T in cases:  # each row is in the results file as soon as it is measured: a cut-off run keeps them
        row = log.start(B=B, T=T)
        check = B * T <= args.check_max_tokens or (B == 1 and T in QUOTED_LENGTHS)
        if missing:
            row["peers_missing"] = missing
        row.update(run_case(B, T, args.shift, peers, check, cfgs, args.bounded_inputs == "on", args.rounds))
        gc.collect()
        torch.cuda.empty_cache()
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        if row.get("passed") is False:
            log.note(f"correctness check FAILED at B={B} T={T}: speed not claimed for this row")
        log.save()
    result = log.result
    checked = all(r.get("passed", True) for r in result.rows)
    cols = [
        "B",
        "T",
        "ours_ms",
        "ours_planned_ms",
        *(f"ours_{p}_ms" for p in names[1:]),
        "intra_ms",
        "select_ms",
        *(f"main_{p}_ms" for p in names),
        "fla_ms",
        "flashqla_ms",
        "flashinfer_ms",
        "ours_host_ms",
        "fla_host_ms",
        "ours_24_layers_ms",
        "fla_24_layers_ms",
        "speedup_vs_fla",
        "speedup_vs_flashqla",
        "speedup_vs_flashinfer",
        "passed",
        "keep_ratio",
        "ours_peak_gib",
        *(f"ours_{p}_peak_gib" for p in names[1:]),
        "fla_peak_gib",
        "ours_gbps",
        "intra_gbps",
        "main_gbps",
        "moved_gb",
    ]
    print(format_table(result.rows, cols))
    path = log.save()
    print(f"wrote {path}")
    _plot(result, f"{args.out}/plots/{args.name}.png", list(peers))
    return 0 if checked else 1


def summarise(rows: list[dict], names: list[str]) -> dict:
    """The summary of ``bench gdn``'s rows (B = 1 rows by length, the headline keys; ``names``: the main-pass variants,
    ours first): the same whether the rows came from one run or several (``--append``).

    A speedup is quoted only from a row whose correctness check ran and passed (a row not checked gives None), and
    against a peer that passed its own check in that row; ``correctness_checked`` is True only if every row the
    summary quotes (B = 1 at :data:`QUOTED_LENGTHS`, where measured) was checked and passed and no row failed. A peer
    missing at a quoted length, or failing its check there, is named in ``<peer>_unavailable`` with the reason."""

    def row_at(T, B=1):
        return next((r for r in rows if r.get("B") == B and r.get("T") == T), None)

    def at(T, key, B=1):
        r = row_at(T, B)
        return None if r is None else r.get(key)

    def checked(T, peer=None):
        r = row_at(T)
        return r is not None and r.get("passed") is True and (peer is None or r.get(f"{peer}_passed") is not False)

    def speedup(T, peer, key="speedup_vs_{}"):
        return at(T, key.format(peer)) if checked(T, peer) else None

    lengths = [r["T"] for r in rows if r.get("B") == 1]
    quoted = [row_at(T) for T in QUOTED_LENGTHS if row_at(T) is not None and "ours_ms" in row_at(T)]
    summary = {
        "speedup_vs_fla_128k": speedup(131072, "fla"),
        "speedup_vs_fla_4k": speedup(4096, "fla"),
        "speedup_vs_flashqla_128k": speedup(131072, "flashqla"),
        "speedup_vs_flashqla_32k": speedup(32768, "flashqla"),
        "speedup_vs_flashinfer_128k": speedup(131072, "flashinfer"),
        "speedup_vs_flashinfer_32k": speedup(32768, "flashinfer"),
        "planned_speedup_vs_fla_4k": speedup(4096, "fla", "planned_speedup_vs_{}"),
        "planned_speedup_vs_fla_128k": speedup(131072, "fla", "planned_speedup_vs_{}"),
        "speedup_24_layers_vs_fla_4k": speedup(4096, "fla", "speedup_24_layers_vs_{}"),
        "speedup_24_layers_vs_fla_128k": speedup(131072, "fla", "speedup_24_layers_vs_{}"),
        "mem_ratio_vs_fla_128k": (at(131072, "ours_peak_gib") / at(131072, "fla_peak_gib"))
        if at(131072, "fla_peak_gib") and at(131072, "ours_peak_gib") is not None
        else None,
        "keep_ratio": at(131072, "keep_ratio") or (at(max(lengths), "keep_ratio") if lengths else None),
        "correctness_checked": bool(quoted)
        and all(r.get("passed") is True for r in quoted)
        and all(r.get("passed", True) for r in rows),
        "main_pass": names[0] if names else None,
    }
    best = {p: at(131072, f"{p}_ms") for p in PEERS if checked(131072, p) and at(131072, f"{p}_ms")}
    if best and at(131072, "ours_ms"):
        name = min(best, key=best.get)
        summary["best_dense_128k"] = name
        summary["speedup_vs_best_dense_128k"] = ratio(best[name], at(131072, "ours_ms"))
    else:
        summary["best_dense_128k"] = summary["speedup_vs_best_dense_128k"] = None
    for p in PEERS:
        reasons = [_peer_unavailable(row_at(T), p) for T in (131072, 32768) if row_at(T) is not None]
        if reasons and all(reasons):
            summary[f"{p}_unavailable"] = reasons[0]
    for p in names[1:]:
        summary[f"main_{p}_vs_{names[0]}_128k"] = ratio(at(131072, f"main_{names[0]}_ms"), at(131072, f"main_{p}_ms"))
    return summary


def _peer_unavailable(row: dict, peer: str) -> str | None:
    """Why ``peer`` has no quotable time in ``row``, or None if it has one."""
    if (row.get("peers_missing") or {}).get(peer):
        return row["peers_missing"][peer]
    if row.get(f"{peer}_error"):
        return f"failed in its correctness check: {row[f'{peer}_error']}"
    if row.get(f"{peer}_passed") is False:
        return f"failed its correctness check: {row.get(f'{peer}_vs_dense_rel'):.3g} from the fp32 dense reference"
    if row.get(f"{peer}_note"):
        return row[f"{peer}_note"]
    if row.get(f"{peer}_ms") is None:
        return "not timed in this row"
    return None


def _plot(result: BenchmarkResult, path: str, peers: list[str]) -> None:
    from ..reports.plot import line_plot

    rows = sorted((r for r in result.rows if r["B"] == 1 and "ours_ms" in r), key=lambda r: r["T"])
    xs = [r["T"] for r in rows]
    series = {
        "longsparse SparseGDN": [r["ours_ms"] for r in rows],
        "longsparse SparseGDN, plan shared (in a model)": [r.get("ours_planned_ms") for r in rows],
    }
    for p in peers:
        series[PEER_LABELS.get(p, p)] = [r.get(f"{p}_ms") for r in rows]
    labels = [f"{t // 1024}K" for t in xs]
    line_plot(
        path,
        xs,
        series,
        title="GDN prefill, one layer (Qwen3.5-4B geometry, B=1, H200)",
        xlabel="sequence length",
        ylabel="ms (median)",
        xticklabels=labels,
    )
