"""``LLMEngine`` on tiny random checkpoints: continuous batching (requests joining mid-decode, chunked prefill, slots
reused) gives every request the tokens ``LLM.generate`` gives it alone, in every attention and GDN mode, with the
offloaded cache and with the CUDA-graph decoder; per-request stop strings, seeds and ``ignore_eos``; aborts free their
slots."""

import pytest

from longsparse import LLM
from longsparse.engine import SamplingParams
from longsparse.engine.llm_engine import LLMEngine
from longsparse.engine.scheduler import SchedulerConfig
from tests.helpers import EVERY_BLOCK_SPARSE, SMALL_BLOCK_SPARSE, one_thread
from tests.tiny_models import EOS, random_ids, tokenized_checkpoints


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return tokenized_checkpoints(tmp_path_factory, ("llama-gqa-bias", "qwen35"), seed=23, max_position_embeddings=512)


# (prompt length, new tokens, step at which the request arrives): more requests than slots, prompts longer than a
# step's token budget, arrivals while others decode
WORKLOAD = [(7, 9, 0), (40, 5, 0), (3, 12, 0), (90, 6, 2), (19, 8, 4), (1, 7, 5), (65, 4, 9), (30, 10, 9)]


def run_workload(engine: LLMEngine, workload, seed: int = 70) -> dict[str, list[int]]:
    """Add each request of ``workload`` at its step, run to the end; request id -> generated token ids."""
    pending = sorted(enumerate(workload), key=lambda item: item[1][2])
    tokens: dict[str, list[int]] = {}
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][1][2] <= step:
            i, (length, new, _) = pending.pop(0)
            rid = engine.add_request(random_ids(length, seed=seed + i), SamplingParams(max_new_tokens=new),
                                     request_id=f"r{i}")  # fmt: skip
            tokens[rid] = []
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
        step += 1
    return tokens


def alone(llm: LLM, workload, seed: int = 70) -> dict[str, list[int]]:
    return {
        f"r{i}": llm.generate([random_ids(length, seed=seed + i)], max_new_tokens=new)[0].token_ids
        for i, (length, new, _) in enumerate(workload)
    }


CONFIG = SchedulerConfig(max_num_seqs=3, max_model_len=128, max_num_batched_tokens=24)

MODES = [
    ("llama-gqa-bias", dict()),
    ("qwen35", dict()),
    ("qwen35", dict(gdn="sparse")),
    ("llama-gqa-bias", dict(attention="sparse", sparse_attention_config=SMALL_BLOCK_SPARSE)),
    ("llama-gqa-bias", dict(attention="sparda", forecast="random", sparse_attention_config=SMALL_BLOCK_SPARSE)),
]


@pytest.mark.parametrize(("case", "modes"), MODES, ids=["llama", "qwen35", "qwen35-sparse-gdn", "sparse", "sparda"])
def test_continuous_batching_gives_each_request_its_tokens_alone(checkpoints, case, modes):
    llm = LLM(checkpoints[case], **modes)
    engine = LLMEngine(llm, CONFIG)
    got = run_workload(engine, WORKLOAD)
    assert got == alone(llm, WORKLOAD)
    records = list(engine.scheduler.records)
    assert all(len(r.decodes) + sum(end - start for _, start, end in r.prefills) <= 24 for r in records)
    # the 90-token prompt is prefilled in chunks, each continuing from the tokens cached before it
    chunks = [(start, end) for r in records for rid, start, end in r.prefills if rid == "r3"]
    assert len(chunks) > 1 and chunks[0][0] == 0 and chunks[-1][1] == 90
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
    # a request arriving later is admitted in a step that decodes others, then decodes beside requests admitted
    # before it
    admitted_at = {rid: r.step for r in records for rid in r.admitted}
    assert any("r4" in r.admitted and r.decodes for r in records)
    assert any("r4" in r.decodes and any(admitted_at[o] < admitted_at["r4"] for o in r.decodes) for r in records)
    # more requests than slots: some waited, and every slot was taken at once
    assert any(r.waiting for r in records)
    assert max(len(r.decodes) for r in records) == CONFIG.max_num_seqs
    assert engine.scheduler.num_free_slots == CONFIG.max_num_seqs and not engine.has_unfinished_requests()


GRAPH_MODES = [
    ("qwen35", dict()),
    ("llama-gqa-bias", dict(attention="sparse", sparse_attention_config=SMALL_BLOCK_SPARSE)),
    ("llama-gqa-bias", dict(attention="sparse", offload="cpu", sparse_attention_config=SMALL_BLOCK_SPARSE)),
]


@pytest.mark.parametrize(("case", "modes"), GRAPH_MODES, ids=["qwen35", "sparse", "sparse-offload"])
def test_graph_decode_under_the_scheduler_gives_each_request_its_tokens_alone(checkpoints, case, modes):
    """The CUDA-graph decoder's step function (no graph off a GPU) over the scheduler's changing batches: rows
    padded with idle slots to a captured batch size (a hybrid model: one graph per size, any slots) or to a captured
    slot set (block-sparse layers), the offloaded cache's padding slots reset before each step."""
    config = SchedulerConfig(max_num_seqs=5, max_model_len=128, max_num_batched_tokens=24)
    llm = LLM(checkpoints[case], cuda_graphs=True, **modes)
    engine = LLMEngine(llm, config)
    assert engine.decode_path == "graph step"
    got = run_workload(engine, WORKLOAD)
    assert got == alone(LLM(checkpoints[case], **modes), WORKLOAD)
    decoded = {len(r.decodes) for r in engine.scheduler.records}
    keys = list(engine.graphs.steppers)
    if case == "qwen35":
        assert 3 in decoded and 4 in keys  # three rows ran padded to the batch size 4
    else:
        assert all(isinstance(k, tuple) for k in keys) and any(len(k) > min(decoded - {0}) for k in keys)


def test_offloaded_cache_takes_whole_prompts_and_gives_the_tokens_alone(checkpoints):
    llm = LLM(checkpoints["llama-gqa-bias"], attention="sparse", offload="cpu",
              sparse_attention_config=EVERY_BLOCK_SPARSE)  # fmt: skip
    engine = LLMEngine(llm, CONFIG)
    assert not engine.config.chunked_prefill
    got = run_workload(engine, WORKLOAD)
    assert got == alone(llm, WORKLOAD)
    # the 90-token prompt, over the step budget, ran whole in a step with no other prompt
    (step,) = [r for r in engine.scheduler.records if any(rid == "r3" for rid, _, _ in r.prefills)]
    assert step.prefills == (("r3", 0, 90),)


def test_text_stop_strings_seeds_and_ignore_eos_per_request(checkpoints):
    llm = LLM(checkpoints["llama-gqa-bias"])
    engine = LLMEngine(llm, CONFIG)
    prompt = "w5 w17 w3 w88 w41"
    greedy = llm.generate([prompt], max_new_tokens=12)[0]
    words = greedy.text.split()
    assert len(words) >= 4
    stop = " ".join(words[2:4])
    cases = {
        "plain": (SamplingParams(max_new_tokens=12), False),
        "stop": (SamplingParams(max_new_tokens=12, stop=(stop,)), False),
        "seeded": (SamplingParams(max_new_tokens=12, temperature=1.3, top_p=0.9, seed=5), False),
        "seeded-again": (SamplingParams(max_new_tokens=12, temperature=1.3, top_p=0.9, seed=5), False),
    }
    texts = {rid: "" for rid in cases}
    tokens: dict[str, list[int]] = {rid: [] for rid in cases}
    reasons = {}
    for rid, (params, ignore_eos) in cases.items():
        engine.add_request(prompt, params, request_id=rid, ignore_eos=ignore_eos)
    while engine.has_unfinished_requests():
        for out in engine.step():
            texts[out.request_id] += out.new_text
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    assert (texts["plain"], tokens["plain"]) == (greedy.text, greedy.token_ids)
    want = llm.generate([prompt], max_new_tokens=12, stop=stop)[0]
    assert texts["stop"] == want.text == greedy.text[: greedy.text.index(stop)] and reasons["stop"] == "stop"
    sampled = llm.generate([prompt], max_new_tokens=12, temperature=1.3, top_p=0.9, seed=5)[0]
    assert tokens["seeded"] == tokens["seeded-again"] == sampled.token_ids
    assert texts["seeded"] == sampled.text


def test_ignore_eos_keeps_decoding_past_the_end_of_sequence_token(checkpoints):
    llm = LLM(checkpoints["llama-gqa-bias"])
    prompt = random_ids(6, seed=18)
    ends = llm.generate([prompt], max_new_tokens=12)[0]
    assert ends.finish_reason == "eos" and len(ends.token_ids) == 4
    engine = LLMEngine(llm, CONFIG)
    engine.add_request(prompt, SamplingParams(max_new_tokens=12), ignore_eos=True)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    tokens = [t for out in outputs for t in out.new_token_ids]
    assert len(tokens) == 12 and tokens[:5] == [*ends.token_ids, EOS] and outputs[-1].finish_reason == "length"


def test_abort_frees_the_slot_for_a_waiting_request(checkpoints):
    llm = LLM(checkpoints["qwen35"])
    engine = LLMEngine(llm, SchedulerConfig(max_num_seqs=1, max_model_len=64, max_num_batched_tokens=16))
    engine.add_request(random_ids(5, seed=1), SamplingParams(max_new_tokens=30), request_id="long")
    engine.add_request(random_ids(6, seed=2), SamplingParams(max_new_tokens=4), request_id="next")
    for _ in range(3):
        engine.step()
    assert [r.request_id for r in engine.scheduler.running] == ["long"] and engine.num_waiting == 1
    assert engine.abort_request("long") and not engine.abort_request("long")
    tokens = []
    while engine.has_unfinished_requests():
        tokens += [t for out in engine.step() for t in out.new_token_ids]
    # the slot's GDN state was emptied before the next prompt took it
    assert tokens == llm.generate([random_ids(6, seed=2)], max_new_tokens=4)[0].token_ids
    assert engine.stats.finished == {"abort": 1, "length": 1}


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ([], SamplingParams(), "at least one token"),
        ([5] * 128, SamplingParams(), "max_model_len is 128"),
        ([5] * 100, SamplingParams(max_new_tokens=40), "ask for at most 28 new tokens"),
        ([5, 101], SamplingParams(), r"\[0, 101\)"),
    ],
    ids=["empty", "prompt-over-limit", "prompt-and-output-over-limit", "token-id-out-of-vocabulary"],
)
def test_requests_that_can_never_run_are_refused_when_added(checkpoints, prompt, params, message):
    engine = LLMEngine(LLM(checkpoints["llama-gqa-bias"]), CONFIG)
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, params)
    assert not engine.has_unfinished_requests()


def test_max_model_len_over_the_models_context_is_refused(checkpoints):
    with pytest.raises(ValueError, match=r"max_model_len \(513\) is over the model's context length \(512\)"):
        LLMEngine(LLM(checkpoints["llama-gqa-bias"]), SchedulerConfig(max_model_len=513))


GPU_MODES = [
    ("qwen35", dict()),
    ("llama-gqa-bias", dict(attention="sparse", sparse_attention_config=SMALL_BLOCK_SPARSE)),
    ("llama-gqa-bias", dict(attention="sparda", forecast="random", sparse_attention_config=SMALL_BLOCK_SPARSE)),
    ("llama-gqa-bias", dict(attention="sparse", offload="cpu", sparse_attention_config=SMALL_BLOCK_SPARSE)),
    ("llama-gqa-bias", dict(attention="sparda", offload="cpu", forecast="random",
                            sparse_attention_config=SMALL_BLOCK_SPARSE)),
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize(
    ("case", "modes"), GPU_MODES, ids=["qwen35", "sparse", "sparda", "sparse-offload", "sparda-offload"]
)
def test_continuous_batching_on_the_gpu_gives_each_request_its_tokens_alone(checkpoints, case, modes, cuda_graphs):
    """The same workload on CUDA, in float32 (bfloat16 rounding would let batching flip near ties): the kernels'
    decode over arbitrary slot sets, the offloaded block cache's slot resets and its CUDA streams; with
    ``cuda_graphs``, decode steps replayed from graphs captured per batch size or slot set (compared with eager
    decoding alone)."""
    config = SchedulerConfig(max_num_seqs=5, max_model_len=128, max_num_batched_tokens=24) if cuda_graphs else CONFIG
    llm = LLM(checkpoints[case], device="cuda", dtype="float32", cuda_graphs=cuda_graphs, **modes)
    engine = LLMEngine(llm, config)
    eager = LLM(checkpoints[case], device="cuda", dtype="float32", **modes) if cuda_graphs else llm
    assert run_workload(engine, WORKLOAD) == alone(eager, WORKLOAD)
    if cuda_graphs:
        assert engine.decode_path == "cuda graph" and engine.graphs.graphs > 0
