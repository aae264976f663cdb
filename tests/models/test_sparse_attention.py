"""Block-sparse attention modes inside the models (tiny random checkpoints, float32, torch references on the CPU):

* a budget that covers every block gives the dense model's logits, in prefill and decode;
* with a real budget, every attention layer's output equals masked attention under the mask of an independent
  float64 selection (InfLLM-V2 from the layer's queries; Forecast from the emitting layer's input through the
  adapter's weights), token by token in prefill and decode;
* the compressed keys kept in the cache equal a recomputation after decode steps;
* a prefill that continues a cached prefix equals the full prefill's rows;
* the reported share of attended blocks is the budget's;
* the Triton kernels (interpreter) give what the references give.
"""

import dataclasses

import pytest
import torch

from longsparse.engine import ModelRunner, allocate_caches
from longsparse.engine.cache import allocate_compressed_keys
from longsparse.models import ExecutionModes, load_model
from longsparse.models.attention import AttentionBackend
from longsparse.models.forecast import ForecastProjections
from longsparse.models.plan import BlockFractions
from longsparse.models.sparse_attention import OracleAttention, SpardaAttention, SparseAttention
from longsparse.ops._triton import INTERPRETER, triton_mode
from longsparse.ops.sparse_attn import SparseAttentionConfig
from longsparse.ops.sparse_attn import naive as R
from tests.helpers import one_thread, rel_err
from tests.tiny_models import build, random_ids, save

# MiniCPM4's geometry scaled down: block 16, two local blocks, two chosen blocks (budget 4), compression 8/4.
SMALL = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=2, kernel_size=8, kernel_stride=4,
                              dense_len=0)  # fmt: skip
FULL = dataclasses.replace(SMALL, topk=16)  # budget 18 blocks >= every sequence here (< 288 tokens)
# dense below 64 tokens: the 37-token prompt prefills densely and turns sparse while decoding
DENSE_BELOW_64 = dataclasses.replace(SMALL, dense_len=64)

PROMPTS = (100, 37, 61)
STEPS = 9  # the middle sequence stops after 4; the others cross a block boundary (112) and six windows
CASES = {
    # three attention layers, G = 3 (SmolLM2's group size)
    "llama3": ("llama-gqa-bias", dict(num_hidden_layers=3, num_attention_heads=6, hidden_size=96)),
    # GDN, attention, GDN, attention: sparda's forecast skips the GDN layer
    "qwen35": ("qwen35", {}),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {
        name: save(build(case, seed=40 + i, **extra), tmp_path_factory.mktemp(name))
        for i, (name, (case, extra)) in enumerate(CASES.items())
    }


# float32 on the CPU runs the torch references; float32 on CUDA runs the compiled kernels ("ieee" products)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def tolerance(device: str) -> float:
    """Relative error allowed between two float32 computations of the same logits (the 1e-4 of the transformers
    parity tests): a continued prefill sums in another order than the full one, through every layer, and on a clean
    2-core machine that alone measured 1.06e-5 — so 1e-5 on the CPU was a threshold the arithmetic can cross."""
    return 1e-4


def load(path, mode, config, adapter=None, device="cpu"):
    where = dict(device=device, dtype=torch.float32)
    if mode == "dense":
        return load_model(path, **where)
    if mode == "sparda" and adapter is None:
        adapter = "random"
    return load_model(path, modes=ExecutionModes(attention=mode), sparse_attention_config=config,
                      forecast=adapter if mode == "sparda" else None, **where)  # fmt: skip


def active_slots(step: int, num_seqs: int) -> list[int]:
    """Of three sequences, all decode for 4 steps, then the middle one stops (its slot leaves a gap)."""
    if num_seqs == 3 and step >= 4:
        return [0, 2]
    return list(range(num_seqs))


def generate_logits(loaded, seqs, prompt_lens=PROMPTS, steps=STEPS):
    """Prefill the prompts packed, then ``steps`` decode steps (slots of :func:`active_slots`) over the rest of
    each sequence. Returns ``(logits [(seq, position, [vocab])], caches, fractions per phase)``."""
    runner = ModelRunner(loaded.model)
    capacity = max(map(len, seqs))
    block = loaded.model.sparse_attention_config.block_size if loaded.model.sparse_attention_config else None
    kv, states = allocate_caches(loaded.config, len(seqs), capacity, loaded.dtype, loaded.device, block_size=block)
    ck = allocate_compressed_keys(loaded.model, len(seqs), capacity)
    out = runner.prefill([s[:n] for s, n in zip(seqs, prompt_lens)], kv_cache=kv, gdn_states=states,
                         compressed_keys=ck, all_logits=True)  # fmt: skip
    fractions = {"prefill": out.block_fractions, "decode": BlockFractions()}
    result, start = [], 0
    for i, n in enumerate(prompt_lens):
        result += [(i, p, out.logits[start + p]) for p in range(n)]
        start += n
    pos = list(prompt_lens)
    for step in range(steps):
        slots = active_slots(step, len(seqs))
        o = runner.decode([seqs[i][pos[i]] for i in slots], prefix_lens=[pos[i] for i in slots], slots=slots,
                          kv_cache=kv, gdn_states=states, compressed_keys=ck)  # fmt: skip
        fractions["decode"].merge(o.block_fractions)
        result += [(i, pos[i], o.logits[r]) for r, i in enumerate(slots)]
        for i in slots:
            pos[i] += 1
    return result, (kv, ck), fractions


def sequences(seed=7):
    return [random_ids(n + STEPS, seed=seed + i) for i, n in enumerate(PROMPTS)]


def stack(result):
    return torch.stack([g.cpu() for _, _, g in result])


@pytest.fixture(scope="module")
def dense_logits(checkpoints):
    return {case: generate_logits(load(path, "dense", None), sequences())[0] for case, path in checkpoints.items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["sparse", "sparda"])
@pytest.mark.parametrize("case", CASES)
def test_budget_covering_every_block_gives_dense_logits(checkpoints, dense_logits, case, mode, device):
    dense = dense_logits[case]
    full, _, fractions = generate_logits(load(checkpoints[case], mode, FULL, device=device), sequences())
    assert [(i, p) for i, p, _ in full] == [(i, p) for i, p, _ in dense]
    assert rel_err(stack(full), stack(dense)) <= tolerance(device)
    assert fractions["prefill"].mean() == pytest.approx(1.0) and fractions["decode"].mean() == pytest.approx(1.0)


@pytest.mark.parametrize("mode", ["sparse", "sparda"])
def test_a_small_budget_changes_the_logits(checkpoints, dense_logits, recorded, mode):
    """The counterpart of the test above: the configuration of the reference tests below is a real restriction."""
    assert rel_err(stack(recorded("llama3", mode, SMALL).logits), stack(dense_logits["llama3"])) > 1e-3


class Recorder(AttentionBackend):
    """Runs the layer's backend and keeps its inputs and output."""

    def __init__(self, inner: AttentionBackend):
        self.inner, self.mode, self.calls = inner, inner.mode, []

    def __call__(self, layer, q, k, v, batch, plan=None):
        o = self.inner(layer, q, k, v, batch, plan)
        tensors = dict(q=q.clone(), k=k.clone(), v=v.clone(), o=o.clone())
        layout = dict(offsets=list(batch.offsets), lens=batch.context_lens, slots=list(batch.slots))
        self.calls.append(dict(**tensors, **layout, decode=batch.is_decode))
        return o


def rope_ref(x, cos, sin):
    """Rotate-half RoPE of ``x [T, H, D]`` over the first ``cos.shape[-1]`` channels, float64."""
    rd, half = cos.shape[-1], cos.shape[-1] // 2
    r = x[..., :rd]
    rotated = torch.cat([-r[..., half:], r[..., :half]], dim=-1)
    return torch.cat([r * cos[:, None].double() + rotated * sin[:, None].double(), x[..., rd:]], dim=-1)


def block_mask(idx, length, block):
    """Decode: block lists ``[Hkv, S]`` of the token at ``length − 1`` -> key mask ``[Hkv, 1, length]``."""
    key_block = torch.arange(length) // block
    return (key_block[None, :, None] == idx[:, None, :].long()).any(-1)[:, None, :]


@dataclasses.dataclass
class RecordedRun:
    """A :func:`generate_logits` run of a model whose attention layers were recorded: backend calls per layer,
    the inputs ``(x, cos, sin)`` of every attention layer per step, and the Forecast adapter (sparda)."""

    loaded: object
    adapter: ForecastProjections | None
    recorders: dict
    inputs: dict
    logits: list
    caches: tuple


@pytest.fixture(scope="module")
def recorded(checkpoints):
    """``recorded(case, mode, config, device)``: one :class:`RecordedRun` per combination, shared by the tests."""
    memo = {}

    def run(case, mode, config, device="cpu"):
        if (case, mode, config, device) not in memo:
            path = checkpoints[case]
            adapter = ForecastProjections.random(load_model(path).config, seed=5) if mode == "sparda" else None
            loaded = load(path, mode, config, adapter, device)
            attention = loaded.config.attention_layers
            recorders, inputs = {}, {i: [] for i in attention}
            for i in attention:
                mixer = loaded.model.model.layers[i].mixer
                recorders[i] = mixer.backend = Recorder(mixer.backend)
                mixer.register_forward_pre_hook(lambda m, args, i=i: inputs[i].append([a.clone() for a in args[:3]]))
            logits, caches, _ = generate_logits(loaded, sequences())
            memo[case, mode, config, device] = RecordedRun(loaded, adapter, recorders, inputs, logits, caches)
        return memo[case, mode, config, device]

    return run


# the Llama with dense_len 0; the hybrid with dense_len 64 (a dense prefill that decodes sparsely later)
RECORDED = [("llama3", SMALL), ("qwen35", DENSE_BELOW_64)]
RECORDED_IDS = ["llama3-dense_len0", "qwen35-dense_len64"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["sparse", "sparda"])
@pytest.mark.parametrize("case, config", RECORDED, ids=RECORDED_IDS)
def test_each_layer_attends_the_blocks_of_an_independent_selection(recorded, case, mode, config, device):
    """Every (layer, step, token) row against float64 masked attention under the reference selection. On CUDA the
    float32 kernels score blocks in another order than the float64 reference, so a near-tie may pick another block:
    up to 1% of the rows may differ there (a wrong block mapping or mask would break most rows)."""
    run = recorded(case, mode, config, device)
    loaded, adapter, recorders, inputs, cfg = run.loaded, run.adapter, run.recorders, run.inputs, config
    attention = loaded.config.attention_layers
    B, Hkv = cfg.block_size, loaded.config.num_key_value_heads
    checked = sparse_rows = mismatched = 0
    for a, layer in enumerate(attention):
        keys = {}  # slot -> [L, Hkv, D] float64, as the sequence grows
        values = {}
        for step, call in enumerate(recorders[layer].calls):
            if mode == "sparda":  # the emitting layer's input at this step, through the adapter's weight
                source = layer if a == 0 else attention[a - 1]
                weight = (adapter.current_weight(layer) if a == 0 else adapter.next_weight(source)).double().cpu()
                x, cos, sin = (t.double().cpu() for t in inputs[source][step])
                f_all = rope_ref((x @ weight.T).view(x.shape[0], Hkv, -1), cos, sin)
            q, k, v, o = (call[n].double().cpu() for n in ("q", "k", "v", "o"))
            for r, slot in enumerate(call["slots"]):
                if call["decode"]:
                    rows = slice(r, r + 1)
                    keys[slot] = torch.cat([keys[slot], k[rows]])
                    values[slot] = torch.cat([values[slot], v[rows]])
                else:
                    rows = slice(call["offsets"][r], call["offsets"][r + 1])
                    keys[slot], values[slot] = k[rows], v[rows]
                L = call["lens"][r]
                kk, vv = keys[slot][None], values[slot][None]
                k_cmp, _ = R.compress_keys_ref(kk, cfg.kernel_size, cfg.kernel_stride)
                scorer = f_all[rows][None] if mode == "sparda" else q[rows][None]
                if call["decode"]:
                    lens = torch.tensor([L])
                    if mode == "sparda":
                        idx = R.forecast_select_decode_ref(scorer[:, 0], k_cmp, lens, cfg)[0]
                    else:
                        idx = R.infllmv2_select_decode_ref(scorer[:, 0], k_cmp, lens, cfg)[0]
                    mask = block_mask(idx, L, B)[None]
                    causal_blocks = -(-L // B)
                    sparse_rows += int(((idx >= 0).sum(-1) < causal_blocks).sum())
                elif L < cfg.dense_len:
                    mask = torch.ones(L, L, dtype=torch.bool).tril().expand(1, Hkv, L, L)
                else:
                    select = R.forecast_select_ref if mode == "sparda" else R.infllmv2_select_ref
                    idx = select(scorer, k_cmp, cfg)
                    mask = R.token_mask_from_blocks(idx, L, B)
                    causal_blocks = torch.arange(L) // B + 1
                    sparse_rows += int(((idx[0] >= 0).sum(-1) < causal_blocks[:, None]).sum())
                want = R.masked_attention_ref(q[rows][None], kk, vv, mask)[0]
                err = (o[rows] - want).flatten(1).norm(dim=1) / want.flatten(1).norm(dim=1)
                assert torch.isfinite(o[rows]).all()
                mismatched += int((err > tolerance(device)).sum())
                checked += L if not call["decode"] else 1
    rows = len(attention) * (sum(PROMPTS) + 3 * 4 + 2 * (STEPS - 4))
    assert checked == rows
    assert mismatched <= (0 if device == "cpu" else rows // 100), f"{mismatched} of {rows} rows differ"
    assert sparse_rows > 100  # the budget restricted many (token, head) rows in every configuration


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["sparse", "sparda"])
@pytest.mark.parametrize("case, config", RECORDED, ids=RECORDED_IDS)
def test_incremental_compressed_keys_equal_a_recomputation(recorded, case, mode, config, device):
    run = recorded(case, mode, config, device)
    kv, ck = run.caches
    final = [PROMPTS[0] + STEPS, PROMPTS[1] + 4, PROMPTS[2] + STEPS]  # the middle sequence stopped after 4 steps
    assert sorted(ck.k_cmp) == list(run.loaded.config.attention_layers)
    for layer in ck.k_cmp:
        for slot, L in enumerate(final):
            keys = kv.keys[layer][slot, :, :L].transpose(0, 1)[None].double().cpu()
            want, _ = R.compress_keys_ref(keys, config.kernel_size, config.kernel_stride)
            n = want.shape[1]
            assert n == config.num_compressed(L) and n >= 9
            assert rel_err(ck.k_cmp[layer][slot, :n].cpu(), want[0]) <= 1e-6
            assert (ck.k_cmp[layer][slot, n:] == 0).all()  # nothing written past the windows completed so far


@pytest.mark.parametrize("mode, config", [("sparse", DENSE_BELOW_64), ("sparda", SMALL)],
                         ids=["sparse-dense_len64", "sparda-dense_len0"])  # fmt: skip
@pytest.mark.parametrize("device", DEVICES)
def test_prefill_after_a_cached_prefix_equals_the_full_prefill(checkpoints, mode, config, device):
    """41 tokens, then 60 more in a second prefill, then 5 decode steps: the logits of a 101-token prefill and its
    decode steps (with dense_len 64 the first chunk is dense, the continued one sparse)."""
    loaded = load(checkpoints["qwen35"], mode, config, device=device)
    ids = random_ids(106, seed=9)
    full, _, _ = generate_logits(loaded, [ids], prompt_lens=(101,), steps=5)
    runner = ModelRunner(loaded.model)
    kv, states = allocate_caches(loaded.config, 1, 106, torch.float32, device, block_size=config.block_size)
    ck = allocate_compressed_keys(loaded.model, 1, 106)
    caches = dict(kv_cache=kv, gdn_states=states, compressed_keys=ck)
    first = runner.prefill([ids[:41]], **caches, all_logits=True).logits
    second = runner.prefill([ids[41:101]], prefix_lens=[41], **caches, all_logits=True).logits
    got = list(torch.cat([first, second]))
    got += [runner.decode([ids[p]], prefix_lens=[p], slots=[0], **caches).logits[0] for p in range(101, 106)]
    assert rel_err(torch.stack(got).cpu(), stack(full)) <= tolerance(device)


def test_reported_block_fractions_are_the_budgets(checkpoints):
    """One 100-token prompt, 14 decode steps, SMALL (budget 4 blocks of 16): a token in block ``qb`` attends
    ``min(4, qb + 1)`` of its ``qb + 1`` causal blocks; the stats average that over tokens, heads and layers."""
    loaded = load(checkpoints["llama3"], "sparse", SMALL)
    _, _, fractions = generate_logits(loaded, [random_ids(114, seed=4)], prompt_lens=(100,), steps=14)

    def share(length):
        blocks = -(-length // SMALL.block_size)
        return min(SMALL.budget_blocks, blocks) / blocks

    assert fractions["prefill"].mean() == pytest.approx(sum(share(t + 1) for t in range(100)) / 100, rel=1e-6)
    assert fractions["decode"].mean() == pytest.approx(sum(share(L) for L in range(101, 115)) / 14, rel=1e-6)
    assert fractions["prefill"].rows == 100 * 2 * 3  # tokens × KV heads × layers


@pytest.mark.slow
@pytest.mark.skipif(triton_mode() != INTERPRETER, reason="runs Triton's CPU interpreter (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("fused_topk", [False, True], ids=["topk", "fused_topk"])
@pytest.mark.parametrize("mode", ["sparse", "sparda"])
def test_triton_kernels_give_the_reference_results(checkpoints, mode, fused_topk):
    """The backends with ``use_kernel=True`` (Triton's interpreter here) against their torch-reference default; with
    the decode top-k fused into the scoring kernel, every layer's selections count in the cache's one counter
    buffer, which they leave zeroed."""
    from longsparse.ops.sparse_attn import SelectKernelConfig

    kernel_config = SelectKernelConfig(decode_fused_topk=fused_topk)
    loaded = load(checkpoints["qwen35"], mode, SMALL)
    seqs = [random_ids(n + 2, seed=11 + n) for n in (70, 33)]
    ref, _, _ = generate_logits(loaded, seqs, prompt_lens=(70, 33), steps=2)
    for layer in loaded.model.model.layers:
        if hasattr(layer.mixer, "backend"):
            layer.mixer.backend.use_kernel = True
            layer.mixer.backend.kernel_config = kernel_config
            for emitter in layer.mixer.forecasters:
                emitter.use_kernel = True
                emitter.kernel_config = kernel_config
    got, (_, ck), _ = generate_logits(loaded, seqs, prompt_lens=(70, 33), steps=2)
    assert rel_err(stack(got), stack(ref)) <= 1e-5
    assert ck.topk_counters.shape == (2 * loaded.config.num_key_value_heads,) and not ck.topk_counters.any()


def test_backends_and_forecasters_follow_the_modes(checkpoints, tmp_path):
    adapter = ForecastProjections.random(load_model(checkpoints["qwen35"]).config, seed=1)
    loaded = load_model(checkpoints["qwen35"], modes=ExecutionModes(attention={1: "sparse", 3: "sparda"}),
                        sparse_attention_config=SMALL, forecast=adapter, device="cpu")  # fmt: skip
    layers = loaded.model.model.layers
    assert isinstance(layers[1].mixer.backend, SparseAttention) and isinstance(layers[3].mixer.backend, SpardaAttention)
    assert [e.target for e in layers[1].mixer.forecasters] == [3]  # layer 1 forecasts layer 3 (a GDN layer between)
    assert layers[1].mixer.forecasters[0].weight is adapter.next_weight(1)
    assert layers[3].mixer.forecasters == []
    assert loaded.model.sparse_attention_layers == (1, 3)
    assert loaded.model.attention_label == (
        "sparse ×1, sparda ×1 with RANDOM Forecast weights (speed only: block choices are meaningless)"
    )
    saved = ForecastProjections.load(adapter.save(tmp_path / "adapter"))
    saved.metadata.pop("random_weights")
    trained = load_model(checkpoints["qwen35"], modes=ExecutionModes(attention="sparda"), forecast=saved, device="cpu")
    assert trained.model.attention_label == "sparda" and trained.model.sparse_attention_layers == (1, 3)
    assert [e.target for e in trained.model.model.layers[1].mixer.forecasters] == [1, 3]  # current and next


def test_sparda_needs_the_local_window_to_cover_a_block(checkpoints):
    with pytest.raises(ValueError, match="sparda needs window >= block_size"):
        load(checkpoints["llama3"], "sparda", dataclasses.replace(SMALL, window=0))


def test_decode_without_compressed_keys_says_what_is_missing(checkpoints):
    loaded = load(checkpoints["llama3"], "sparse", SMALL)
    runner = ModelRunner(loaded.model)
    kv, _ = allocate_caches(loaded.config, 1, 32, torch.float32, "cpu", block_size=16)
    runner.prefill([[1, 2, 3]], kv_cache=kv)
    with pytest.raises(ValueError, match="needs the KV cache and this layer's compressed keys"):
        runner.decode([4], prefix_lens=[3], slots=[0], kv_cache=kv, gdn_states=None)


def test_configured_tile_tokens_set_the_prefill_plan():
    """``SparseAttentionConfig.tile_tokens`` is the plan's tile (the group size picks it otherwise); a tile too
    small for 16 (token, head) rows, and a value that is not a power of two dividing the block, are refused."""
    from longsparse.models.sparse_attention import _tile_tokens

    base = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=4, kernel_size=16, kernel_stride=8,
                                 dense_len=0)  # fmt: skip
    assert _tile_tokens(base, 4) == 16 and _tile_tokens(base, 16) == 4  # 64 rows either way
    assert _tile_tokens(dataclasses.replace(base, tile_tokens=4), 4) == 4
    with pytest.raises(ValueError, match="gives 8 .token, head. rows for 4 query heads"):
        _tile_tokens(dataclasses.replace(base, tile_tokens=2), 4)
    for bad in (3, 32, 0):
        with pytest.raises(ValueError, match="tile_tokens must be None or a power of two"):
            dataclasses.replace(base, tile_tokens=bad)
    backend = SparseAttention(dataclasses.replace(base, tile_tokens=4), use_kernel=False)
    gen = torch.Generator().manual_seed(0)
    q, k_cmp = torch.randn(1, 100, 8, 16, generator=gen), torch.randn(1, 11, 2, 16, generator=gen)
    selection = backend.select_prefill(0, q, k_cmp, None, slice(0, 100), 0, None)
    assert selection.plan.tile_tokens == 4 and selection.plan.counts.shape[-1] == 25


def _with_backends(loaded, make):
    """Every block-sparse layer of ``loaded`` gets ``make(config)`` wrapped in a :class:`Recorder`."""
    for i in loaded.model.sparse_attention_layers:
        mixer = loaded.model.model.layers[i].mixer
        mixer.backend = Recorder(make(loaded.model.sparse_attention_config))
    return loaded


def test_oracle_layers_attend_the_blocks_of_largest_dense_mass(checkpoints):
    """The diagnostic oracle backend, row by row in prefill and decode, against float64 masked attention under the
    reference oracle selection of the layer's own queries and keys."""
    loaded = _with_backends(load(checkpoints["llama3"], "sparse", SMALL), OracleAttention)
    generate_logits(loaded, sequences())
    cfg, mismatched, rows, sparse_rows = SMALL, 0, 0, 0
    for layer in loaded.config.attention_layers:
        keys, values = {}, {}
        for call in loaded.model.model.layers[layer].mixer.backend.calls:
            q, k, v, o = (call[n].double() for n in ("q", "k", "v", "o"))
            for r, slot in enumerate(call["slots"]):
                if call["decode"]:
                    sl = slice(r, r + 1)
                    keys[slot], values[slot] = torch.cat([keys[slot], k[sl]]), torch.cat([values[slot], v[sl]])
                else:
                    sl = slice(call["offsets"][r], call["offsets"][r + 1])
                    keys[slot], values[slot] = k[sl], v[sl]
                L = call["lens"][r]
                kk, vv = keys[slot][None], values[slot][None]
                if call["decode"]:
                    idx = R.oracle_select_decode_ref(q[sl], kk, torch.tensor([L]), cfg)[0]
                    mask = block_mask(idx, L, cfg.block_size)[None]
                    sparse_rows += int(((idx >= 0).sum(-1) < -(-L // cfg.block_size)).sum())
                else:
                    idx = R.oracle_select_ref(q[sl][None], kk, cfg)
                    mask = R.token_mask_from_blocks(idx, L, cfg.block_size)
                want = R.masked_attention_ref(q[sl][None], kk, vv, mask)[0]
                err = (o[sl] - want).flatten(1).norm(dim=1) / want.flatten(1).norm(dim=1)
                mismatched += int((err > 1e-4).sum())
                rows += err.numel()
    assert rows == 3 * (sum(PROMPTS) + 3 * 4 + 2 * (STEPS - 4)) and mismatched == 0
    assert sparse_rows > 20


def test_sparse_phases_place_the_sparsity_in_prefill_or_decode(checkpoints, dense_logits):
    """Dense prefill + sparse decode: the prefill logits are the dense model's, the decode ones are not (the
    compressed keys the dense prefill wrote drive the decode selections); sparse prefill + dense decode: the prefill
    logits are the sparse model's, the decode ones differ from both."""
    dense = dense_logits["llama3"]
    sparse, _, _ = generate_logits(load(checkpoints["llama3"], "sparse", SMALL), sequences())
    logits = {}
    for phases in (("decode",), ("prefill",)):
        loaded = load(checkpoints["llama3"], "sparse", SMALL)
        for i in loaded.model.sparse_attention_layers:
            loaded.model.model.layers[i].mixer.backend = SparseAttention(SMALL, sparse_phases=phases)
        logits[phases], _, fractions = generate_logits(loaded, sequences())
        dense_phase = "prefill" if phases == ("decode",) else "decode"
        assert fractions[dense_phase].mean() == pytest.approx(1.0) and fractions[phases[0]].mean() < 0.99
    n = sum(PROMPTS)

    def err(a, b, part):
        return rel_err(stack(a[:n] if part == "prefill" else a[n:]), stack(b[:n] if part == "prefill" else b[n:]))

    assert err(logits[("decode",)], dense, "prefill") <= 1e-5 and err(logits[("decode",)], dense, "decode") > 1e-3
    assert err(logits[("prefill",)], sparse, "prefill") <= 1e-5
    assert err(logits[("prefill",)], sparse, "decode") > 1e-3 and err(logits[("prefill",)], dense, "decode") > 1e-3
    with pytest.raises(ValueError, match="sparse_phases"):
        SparseAttention(SMALL, sparse_phases=("verify",))
