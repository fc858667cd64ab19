"""``/metrics``: the server's Prometheus metrics under vLLM's names, so vLLM's dashboards and
alerts read a legato server unchanged (``vllm:`` prefix, seconds, the same label names)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip


class ServerMetrics:
    """One registry per server (tests start several in one process)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.model_name = model_name

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, labels, buckets=_LATENCY_BUCKETS, registry=self.registry)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token")
        self.tpot = histogram("vllm:time_per_output_token_seconds", "Time per output token")
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency")
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch",
                             labels, registry=self.registry)  # fmt: skip
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled",
                             labels, registry=self.registry)  # fmt: skip
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1)",
                              labels, registry=self.registry)  # fmt: skip
        self.cpu_kv_usage = Gauge("vllm:cpu_cache_usage_perc",
                                  "Fraction of host swap space (KV blocks) in use (0-1)",
                                  labels, registry=self.registry)  # fmt: skip
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed",
                                     labels, registry=self.registry)  # fmt: skip
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated",
                                         labels, registry=self.registry)  # fmt: skip
        self.finished = Counter("vllm:request_success", "Finished requests",
                                [*labels, "finished_reason"], registry=self.registry)  # fmt: skip
        self.lora_info = Gauge(
            "vllm:lora_requests_info", "Running and waiting LoRA adapters",
            ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
            registry=self.registry,
        )  # fmt: skip

    def observe_engine(self, engine) -> None:
        """Gauges read off the engine (called on each scrape)."""
        name = self.model_name
        self.running.labels(name).set(len(engine.running))
        self.waiting.labels(name).set(len(engine.waiting))
        self.kv_usage.labels(name).set(engine.blocks.used / engine.blocks.num_blocks)
        host = engine.memory.host_kv
        self.cpu_kv_usage.labels(name).set(len(host.blocks) / host.capacity if host.capacity else 0)
        self.lora_info.clear()
        running = sorted({r.adapter for r in engine.running if r.adapter})
        waiting = sorted({r.adapter for r in engine.waiting if r.adapter})
        self.lora_info.labels(
            str(len(engine.adapters)), ",".join(waiting), ",".join(running)
        ).set_to_current_time()

    def observe_finished(self, request, now: float) -> None:
        name = self.model_name
        self.finished.labels(name, request.finish_reason).inc()
        self.prompt_tokens.labels(name).inc(len(request.prompt))
        self.generation_tokens.labels(name).inc(len(request.output))
        self.e2e.labels(name).observe(now - request.arrival_s)
        if request.first_token_s is not None:
            self.ttft.labels(name).observe(request.first_token_s - request.arrival_s)
            if len(request.output) > 1:
                per_token = (now - request.first_token_s) / (len(request.output) - 1)
                self.tpot.labels(name).observe(per_token)
