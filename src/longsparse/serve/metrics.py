"""``GET /metrics``: the engine's state and totals and the server's request timings in Prometheus' text format, under
vLLM's metric names with the ``longsparse:`` prefix.

Each app has a registry of its own (no process-global metrics). The engine's figures are read when scraped (a
collector), so the engine keeps plain counters and nothing is counted twice.
"""

from __future__ import annotations

from ..engine.async_engine import AsyncLLMEngine

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)


class EngineCollector:
    """Gauges and counters of an :class:`AsyncLLMEngine`, read at each scrape."""

    def __init__(self, engine: AsyncLLMEngine):
        self.engine = engine

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        core = self.engine.engine
        stats = core.stats
        gauges = (
            ("num_requests_running", "Requests in the running batch.", core.num_running),
            ("num_requests_waiting", "Requests waiting for a cache slot.", core.num_waiting),
            ("kv_cache_usage_perc", "Share of the KV cache's token positions holding running requests' tokens "
             "(1 = full).", core.kv_usage()),
            ("num_cache_slots", "Cache slots (--max-num-seqs).", core.config.max_num_seqs),
            ("engine_alive", "1 while the engine thread runs.", int(self.engine.alive)),
        )  # fmt: skip
        for name, doc, value in gauges:
            yield GaugeMetricFamily(f"longsparse:{name}", doc, value=value)
        yield CounterMetricFamily("longsparse:prompt_tokens", "Prompt tokens prefilled.", value=stats.prompt_tokens)
        yield CounterMetricFamily("longsparse:generation_tokens", "Tokens sampled.", value=stats.generation_tokens)
        yield CounterMetricFamily("longsparse:engine_steps", "Scheduler steps run.", value=stats.steps)
        finished = CounterMetricFamily(
            "longsparse:request_success", "Finished requests by finish reason.", labels=["finished_reason"]
        )
        for reason, count in sorted(dict(stats.finished).items()):
            finished.add_metric([reason], count)
        yield finished


class ServerMetrics:
    """The registry of one app: the engine's collector, request latencies and HTTP errors by status."""

    def __init__(self, engine: AsyncLLMEngine):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(engine))
        self.ttft = Histogram(
            "longsparse:time_to_first_token_seconds", "Time from a request's arrival to its first token.",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.e2e = Histogram(
            "longsparse:e2e_request_latency_seconds", "Time from a request's arrival to its end.",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.errors = Counter(
            "longsparse:request_errors", "Requests answered with an error, by HTTP status.", ["status"],
            registry=self.registry,
        )  # fmt: skip

    def render(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
