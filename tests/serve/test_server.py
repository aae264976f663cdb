"""``longsparse serve``'s app against the official ``openai`` client and raw HTTP, on the default model (SmolLM2-135M)
served by uvicorn on a loopback port: completions and chat completions, streamed and not; concurrent streams return
the greedy texts of one-at-a-time runs and join the running batch mid-decode; bad requests get OpenAI error bodies
and the server goes on; a client that goes away frees its slot; metrics; a full queue answers 503."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from tests.serve.conftest import SMOLLM2_CONFIG, serve

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Gated DeltaNet layers keep a fixed-size state, so reading a long document costs the same per token.",
    "Block-sparse attention reads only the key blocks a query needs.",
    "A server shares one GPU among many users.",
]
# (prompt, max_tokens): different prompt lengths (one past the 48-token step budget: prefilled in chunks) and outputs
CASES = [
    ("Once upon a time", 6),
    ("The capital of France is", 3),
    (" ".join(SENTENCES[:3]) + " In short,", 8),
    ("def fibonacci(n):", 5),
    (SENTENCES[1] + " Therefore", 7),
    (" ".join(SENTENCES * 2) + " To summarize:", 4),
    ("1, 2, 3, 4,", 9),
    ("Question: what is two plus two? Answer:", 2),
]


def client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)


def wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_models_and_completions_streamed_and_not(smollm2_server):
    live = smollm2_server
    c = client(live)
    (model,) = c.models.list().data
    assert model.id == live.name and model.model_extra["max_model_len"] == SMOLLM2_CONFIG.max_model_len
    prompt, max_tokens = CASES[0]
    want = live.llm.generate([prompt], max_new_tokens=max_tokens)[0]
    done = c.completions.create(model=live.name, prompt=prompt, max_tokens=max_tokens, temperature=0)
    assert done.choices[0].text == want.text and done.choices[0].finish_reason == "length"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (want.prompt_tokens, max_tokens)
    chunks = list(
        c.completions.create(
            model=live.name, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == want.text
    assert len([ch for ch in chunks if ch.choices]) > 1  # token by token, not one block
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == max_tokens
    # a batch of prompts in one request, answered in order
    both = c.completions.create(model=live.name, prompt=[CASES[1][0], prompt], max_tokens=3, temperature=0)
    assert [ch.index for ch in both.choices] == [0, 1]
    assert both.choices[1].text == want.text[: len(both.choices[1].text)]


def test_chat_completions_streamed_and_not(smollm2_server):
    live = smollm2_server
    c = client(live)
    messages = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Name a color."}]
    ids = live.llm.tokenizer.chat_ids(messages)
    want = live.llm.generate([ids], max_new_tokens=6)[0]
    done = c.chat.completions.create(model=live.name, messages=messages, max_tokens=6, temperature=0)
    assert done.choices[0].message.role == "assistant" and done.choices[0].message.content == want.text
    assert done.usage.prompt_tokens == len(ids) and done.object == "chat.completion"
    chunks = list(
        c.chat.completions.create(model=live.name, messages=messages, max_tokens=6, temperature=0, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    # a stop string cuts the text and ends with finish_reason "stop"
    if len(want.text) > 3:
        stop = want.text[2:4]
        cut = c.chat.completions.create(model=live.name, messages=messages, max_tokens=6, temperature=0, stop=[stop])
        assert cut.choices[0].message.content == want.text[: want.text.index(stop)]
        assert cut.choices[0].finish_reason == "stop"


def test_concurrent_streams_equal_sequential_greedy_runs(smollm2_server):
    live = smollm2_server
    c = client(live)
    sequential = [
        c.completions.create(model=live.name, prompt=p, max_tokens=n, temperature=0).choices[0].text for p, n in CASES
    ]
    first_step = live.scheduler.records[-1].step + 1

    async def stream(aclient, prompt: str, max_tokens: int) -> tuple[str, str]:
        text, request_id = "", None
        response = await aclient.completions.create(
            model=live.name, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
        )
        async for chunk in response:
            request_id = chunk.id
            text += chunk.choices[0].text
        return text, f"{request_id}-0"

    async def all_at_once():
        async with openai.AsyncOpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0) as aclient:
            return await asyncio.gather(*(stream(aclient, p, n) for p, n in CASES))

    results = asyncio.run(all_at_once())
    assert [text for text, _ in results] == sequential
    records = [r for r in live.scheduler.records if r.step >= first_step]
    ids = [rid for _, rid in results]
    # eight requests over four slots: requests waited, were admitted as slots freed, and decoded beside others
    assert max(len(r.decodes) for r in records) == SMOLLM2_CONFIG.max_num_seqs
    late = [r for r in records if r.admitted and r.decodes]
    assert late and all(set(r.admitted) <= set(ids) for r in late)
    long_id = ids[5]
    assert len([p for r in records for p in r.prefills if p[0] == long_id]) > 1  # its prompt ran in chunks


def test_a_request_arriving_mid_decode_joins_the_running_batch(smollm2_server):
    live = smollm2_server
    first_step = live.scheduler.records[-1].step + 1
    texts: dict[str, str] = {}
    first_id = []

    def long_stream():
        stream = client(live).completions.create(
            model=live.name, prompt=CASES[0][0], max_tokens=24, temperature=0, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        texts["long"] = ""
        for chunk in stream:
            first_id.append(chunk.id)
            texts["long"] += chunk.choices[0].text

    thread = threading.Thread(target=long_stream)
    thread.start()
    wait_until(lambda: len(first_id) >= 3)  # the long request is decoding
    late = client(live).completions.create(model=live.name, prompt=CASES[3][0], max_tokens=4, temperature=0)
    thread.join(120)
    long_id, late_id = f"{first_id[0]}-0", f"{late.id}-0"
    records = [r for r in live.scheduler.records if r.step >= first_step]
    (admitted,) = [r for r in records if late_id in r.admitted]
    assert long_id in admitted.decodes  # prefilled in a step that decoded the long request
    assert any({long_id, late_id} <= set(r.decodes) for r in records)  # then decoded beside it
    assert late.choices[0].text == live.llm.generate([CASES[3][0]], max_new_tokens=4)[0].text


BAD_REQUESTS = [
    ("malformed-json", "/v1/completions", '{"prompt": "hi", ', 400, None),
    ("unknown-model", "/v1/completions", {"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    ("negative-max-tokens", "/v1/completions", {"prompt": "hi", "max_tokens": -3}, 400, "max_tokens"),
    ("prompt-over-max-model-len", "/v1/completions", {"prompt": "hello " * 400, "max_tokens": 2}, 400, "prompt"),
    ("prompt-and-output-over-max-model-len", "/v1/completions", {"prompt": "hello " * 300, "max_tokens": 100}, 400,
     "prompt"),
    ("unsupported-n", "/v1/completions", {"prompt": "hi", "n": 2}, 400, "n"),
    ("unsupported-logprobs", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                     "logprobs": True}, 400, "logprobs"),
    ("wrong-type", "/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("negative-temperature", "/v1/completions", {"prompt": "hi", "temperature": -1}, 400, None),
    ("token-id-out-of-vocabulary", "/v1/completions", {"prompt": [1, 2, 10**9]}, 400, "prompt"),
    ("no-messages", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("unknown-role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, None),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status", "param"), [b[1:] for b in BAD_REQUESTS],
                         ids=[b[0] for b in BAD_REQUESTS])  # fmt: skip
def test_bad_requests_get_openai_error_bodies_and_the_server_goes_on(smollm2_server, path, body, status, param):
    live = smollm2_server
    content = body if isinstance(body, str) else json.dumps(body)
    response = httpx.post(live.url + path, content=content, headers={"Content-Type": "application/json"}, timeout=60)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == status and error["message"] and error["type"].endswith("Error")
    if param is not None:
        assert error["param"] == param
    ok = client(live).completions.create(model=live.name, prompt="Hi", max_tokens=1, temperature=0)
    assert ok.usage.completion_tokens == 1


def test_the_openai_client_raises_its_own_errors(smollm2_server):
    c = client(smollm2_server)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.completions.create(model="nope", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="max_model_len is 320"):
        c.completions.create(model=smollm2_server.name, prompt="hello " * 400, max_tokens=1)


def test_a_client_that_disconnects_mid_stream_frees_its_slot(smollm2_server):
    """Every slot taken by streams; a fifth request waits; one stream's client goes away: its request is aborted and
    the waiting one is admitted into the freed slot and completes while the others still run."""
    live = smollm2_server
    aborted_before = live.engine.engine.stats.finished["abort"]
    body = {"model": live.name, "prompt": "Count: 1, 2, 3,", "max_tokens": 200, "temperature": 0, "stream": True,
            "ignore_eos": True}  # fmt: skip
    http = httpx.Client(timeout=120)
    streams = [http.stream("POST", live.url + "/v1/completions", json=body) for _ in range(SMOLLM2_CONFIG.max_num_seqs)]
    responses = [s.__enter__() for s in streams]
    lines = [r.iter_lines() for r in responses]
    ids = []
    for it in lines:
        first = next(line for line in it if line.startswith("data: "))
        ids.append(json.loads(first[len("data: ") :])["id"] + "-0")
    assert live.scheduler.num_free_slots == 0
    waiting: dict = {}
    thread = threading.Thread(
        target=lambda: waiting.update(
            done=client(live).completions.create(model=live.name, prompt="Hi", max_tokens=2, temperature=0)
        )
    )
    thread.start()
    wait_until(lambda: live.engine.engine.num_waiting == 1)
    streams[0].__exit__(None, None, None)  # the client goes away
    thread.join(120)
    assert waiting["done"].usage.completion_tokens == 2
    assert live.engine.engine.stats.finished["abort"] == aborted_before + 1
    late_id = f"{waiting['done'].id}-0"
    (admitted,) = [r for r in live.scheduler.records if late_id in r.admitted]
    assert ids[0] not in admitted.decodes and set(ids[1:]) <= set(admitted.decodes)
    for s in streams[1:]:
        s.__exit__(None, None, None)
    http.close()
    wait_until(lambda: live.scheduler.num_free_slots == SMOLLM2_CONFIG.max_num_seqs)


def test_metrics_in_prometheus_text(smollm2_server):
    live = smollm2_server
    client(live).completions.create(model=live.name, prompt="Hi", max_tokens=2, temperature=0)
    httpx.post(live.url + "/v1/completions", json={"prompt": "hi", "n": 5}, timeout=30)
    assert httpx.get(live.url + "/health").status_code == 200
    response = httpx.get(live.url + "/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    values = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    assert values["longsparse:num_requests_running"] == 0 and values["longsparse:num_requests_waiting"] == 0
    assert values["longsparse:kv_cache_usage_perc"] == 0
    assert values["longsparse:generation_tokens_total"] >= 2 and values["longsparse:prompt_tokens_total"] > 0
    assert values['longsparse:request_success_total{finished_reason="length"}'] >= 1
    assert values['longsparse:request_errors_total{status="400"}'] >= 1
    assert values["longsparse:time_to_first_token_seconds_count"] >= 1


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    """A tiny random model with one slot and no queue: a second request finds the queue full."""
    from longsparse import LLM
    from longsparse.engine.scheduler import SchedulerConfig
    from tests.tiny_models import EOS, build, save, write_tokenizer

    hf = build("llama-gqa-bias", seed=5, eos_token_id=EOS, bos_token_id=None, max_position_embeddings=4096)
    path = save(hf, tmp_path_factory.mktemp("tiny-serve"))
    write_tokenizer(path)
    config = SchedulerConfig(max_num_seqs=1, max_model_len=4096, max_num_batched_tokens=16, max_queued_requests=0)
    yield from serve(LLM(path), config, "tiny")


def test_a_full_queue_answers_503_and_the_server_goes_on(tiny_server):
    live = tiny_server
    # thousands of tokens: the stream still runs when the second request comes (the client closes it after)
    body = {"prompt": "w1 w2", "max_tokens": 4000, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", live.url + "/v1/completions", json=body) as response:
        lines = response.iter_lines()  # kept: a closed line iterator closes the connection
        next(line for line in lines if line.startswith("data: "))
        refused = http.post(live.url + "/v1/completions", json={"prompt": "w3", "max_tokens": 2})
        assert refused.status_code == 503 and "max_queued_requests" in refused.json()["error"]["message"]
    wait_until(lambda: live.scheduler.num_free_slots == 1)
    ok = httpx.post(live.url + "/v1/completions", json={"prompt": "w3", "max_tokens": 2, "temperature": 0}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_a_failed_engine_step_fails_its_requests_and_the_server_goes_on(tiny_server, monkeypatch):
    live = tiny_server
    runner = live.llm.runner
    real_prefill = runner.prefill

    def broken_once(*args, **kwargs):
        monkeypatch.setattr(runner, "prefill", real_prefill)
        raise RuntimeError("device lost")

    monkeypatch.setattr(runner, "prefill", broken_once)
    body = {"prompt": "w1 w2 w3", "max_tokens": 3, "temperature": 0}
    failed = httpx.post(live.url + "/v1/completions", json=body, timeout=60)
    assert failed.status_code == 500 and "device lost" in failed.json()["error"]["message"]
    wait_until(lambda: live.scheduler.num_free_slots == 1)
    ok = httpx.post(live.url + "/v1/completions", json=body, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
    assert httpx.get(live.url + "/health").status_code == 200
