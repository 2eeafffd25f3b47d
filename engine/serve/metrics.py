"""The server's Prometheus metrics (GET /metrics), on a registry of its own."""

from __future__ import annotations

import collections
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self, kv_budget: int) -> None:
        self.registry = r = CollectorRegistry()
        self.queue = Gauge("kakeya_queue_depth", "Requests waiting for admission", registry=r)
        self.running = Gauge("kakeya_running_sequences", "Sequences prefilling or decoding", registry=r)
        self.kv_held = Gauge("kakeya_kv_bytes_held", "K/V bytes the running sequences hold", registry=r)
        self.kv_held_max = Gauge(
            "kakeya_kv_bytes_held_max", "The most K/V bytes held at any step", registry=r
        )
        self.kv_reserved = Gauge(
            "kakeya_kv_bytes_reserved", "K/V bytes reserved by admitted sequences (their bound)", registry=r
        )
        self.kv_budget = Gauge("kakeya_kv_budget_bytes", "The server's K/V budget (--kv-budget)", registry=r)
        self.kv_budget.set(kv_budget)
        self.tok_s = Gauge(
            "kakeya_tokens_per_second", "Generated tokens per second over the last 10 s", registry=r
        )
        self.generated = Counter("kakeya_generation_tokens", "Tokens generated", registry=r)
        self.prompt = Counter("kakeya_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.requests = Counter(
            "kakeya_requests_finished", "Requests finished, by reason", ["reason"], registry=r
        )
        self.refused = Counter(
            "kakeya_requests_refused", "Requests refused, by status", ["status"], registry=r
        )
        self.steps = Counter(
            "kakeya_decode_steps",
            "Batched decode steps, by draft length k (0: a plain step)",
            ["k"],
            registry=r,
        )
        self.row_steps = Counter(
            "kakeya_decode_row_steps",
            "Rows stepped (a step of n rows counts n), by draft length k",
            ["k"],
            registry=r,
        )
        self.ttft = Histogram(
            "kakeya_time_to_first_token_seconds",
            "Arrival to first token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "kakeya_inter_token_latency_seconds",
            "Time between a request's token emissions",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._lock = threading.Lock()
        self._recent: collections.deque[tuple[float, int]] = collections.deque()

    def tokens(self, n: int) -> None:
        self.generated.inc(n)
        now = time.monotonic()
        with self._lock:
            self._recent.append((now, n))
            self._rate(now)

    def _rate(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - 10:
            self._recent.popleft()
        self.tok_s.set(sum(n for _, n in self._recent) / 10)

    def finished(self, reason: str, prompt_tokens: int, new_tokens: int) -> None:
        self.requests.labels(reason.split(":")[0]).inc()
        self.prompt.inc(prompt_tokens)

    def gauges(self, waiting: int, running: int, held: int, reserved: int) -> None:
        self.queue.set(waiting)
        self.running.set(running)
        self.kv_held.set(held)
        self.kv_reserved.set(reserved)

    def observe_held(self, held: int) -> None:
        if held > self.kv_held_max._value.get():
            self.kv_held_max.set(held)

    def render(self) -> bytes:
        with self._lock:
            self._rate(time.monotonic())
        return generate_latest(self.registry)
