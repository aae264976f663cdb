"""Correlated-key accuracy: where does the bf16 kernels' error against the spec come from, and what is FLA's?"""
import json, os
import torch
from longsparse.bench.peers import fla_chunk_gated_delta_rule
from longsparse.ops.gdn import SparseGDNConfig, naive_chunk_gated_delta_rule, sparse_chunk_gated_delta_rule
from longsparse.ops.gdn.intra import BLOCK_ORDER, intra_forward
from longsparse.ops.gdn import launch
from tests.helpers import rel_err
from tests.ops.gdn.helpers import spec_trace
from tests.ops.gdn.test_sparse_kernels import _qwen_inputs, _correlated_keys

fla = fla_chunk_gated_delta_rule()
rows = []
for spread in (None, 0.3, 0.1):
    (q, k, v, g, beta, h0, gate, w), cu = _qwen_inputs([3000, 77, 64 * 70, 1])
    if spread:
        k = _correlated_keys(k, spread=spread)
    r = {"spread": spread}
    ref64, s64 = naive_chunk_gated_delta_rule(q.double(), k.double(), v.double(), g.double(), beta.double(),
                                              initial_state=h0.double(), cu_seqlens=cu, output_final_state=True)
    ref32, _ = naive_chunk_gated_delta_rule(q.float(), k.float(), v.float(), g, beta, initial_state=h0, cu_seqlens=cu)
    ref16, _ = naive_chunk_gated_delta_rule(q, k, v, g.bfloat16(), beta.bfloat16(), initial_state=h0, cu_seqlens=cu)
    r["naive_bf16in_vs_64"] = rel_err(ref16, ref64); r["naive_fp32_vs_64"] = rel_err(ref32, ref64)
    if fla is not None:
        fo, fs = fla(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        r["fla_vs_64"] = rel_err(fo, ref64); r["fla_state_vs_64"] = rel_err(fs, s64)
    tr = spec_trace(q.float(), k.float(), v.float(), g, beta, SparseGDNConfig(backend="torch"), initial_state=h0, cu_seqlens=cu)
    r["spec32_vs_64"] = rel_err(tr.o, ref64)
    for mp in ("walk", "csr"):
        o, s, _, _ = launch.run_kernels(q, k, v, g, beta, None, h0, cu, config=SparseGDNConfig(main_pass=mp), mask=tr.selection.mask)
        r[f"{mp}_specmask_vs_spec32"] = rel_err(o, tr.o); r[f"{mp}_specmask_vs_64"] = rel_err(o, ref64)
        r[f"{mp}_state_vs_spec32"] = rel_err(s, tr.recurrence.final_state)
    o, s = sparse_chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, output_final_state=True)
    r["public_vs_64"] = rel_err(o, ref64); r["public_state_vs_64"] = rel_err(s, s64)
    # stage 1 alone on one sequence
    L = 64 * 40 + 7
    q1, k1, v1, g1, b1 = (x[:, :L] for x in (q, k, v, g, beta))
    t1 = spec_trace(q1.float(), k1.float(), v1.float(), g1, b1, SparseGDNConfig(backend="torch"))
    lay = t1.layout
    ct, gamma, score = intra_forward(k1[0], v1[0], g1[0], b1[0], lay.token_index[:, 0].int(), lay.chunk_len.int())
    errs = []
    for b, (_, j) in enumerate(BLOCK_ORDER):
        e_Gj = t1.inputs.G[:, :, 16 * j : 16 * j + 16].exp()
        errs.append(rel_err(ct[:, :, b].float().transpose(0, 1) * e_Gj[..., None, :], t1.intra.cbar[:, :, b]))
    r["intra_ct_block_err"] = errs
    r["intra_score_err"] = rel_err(score.T, t1.intra.score)
    print(r, flush=True)
    rows.append(r)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "corr_diag.json"), "w"), indent=1)
