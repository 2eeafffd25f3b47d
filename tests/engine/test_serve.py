"""`kakeya serve` over real HTTP: the official `openai` client (streaming and not, both endpoints,
seeded sampling), raw HTTP for bad input, and 200 concurrent asyncio clients with random disconnects."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from engine.policy import parse_policy
from engine.serve.config import ServeConfig
from engine.zoo import corpus
from tests.engine.serve_support import Running, metric, serving

MODEL = "zoo:tiny-hybrid"
POLICY = "sink_window:4:32"  # wraps within these prompts: the bounded cache is exercised


@pytest.fixture(scope="module")
def server() -> Iterator[Running]:
    config = ServeConfig(
        model=MODEL,
        policy=parse_policy(POLICY),
        kv_budget=16 * 200_000,
        max_queue=512,
        max_tokens=16,
        threads=1,
    )
    with serving(config) as running:
        yield running


def client(server: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


PROMPTS = corpus.code_prompts(6, 7, 40)


def test_openai_client_completions_stream_and_not(server: Running) -> None:
    c = client(server)
    assert [m.id for m in c.models.list().data] == [MODEL]
    for prompt in PROMPTS[:3]:
        ids = server.model.encode(prompt)
        want = server.reference(ids, 24)
        out = c.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        assert out.choices[0].text == server.text(want)
        assert out.choices[0].finish_reason in ("length", "stop")
        assert out.usage is not None and out.usage.prompt_tokens == len(ids)
        assert out.usage.completion_tokens == len(want) and out.usage.total_tokens == len(ids) + len(want)
        chunks = list(
            c.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=24,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == server.text(want)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(want)
        assert len([ch for ch in chunks if ch.choices and ch.choices[0].text]) > 1  # streamed, not one blob


def test_openai_client_chat_stream_and_not(server: Running) -> None:
    c = client(server)
    messages = [{"role": "system", "content": "a tall table"}, {"role": "user", "content": PROMPTS[3]}]
    # the zoo tokenizer has no chat template: the plain format (docs/serving.md)
    ids = server.model.encode("a tall table\n" + PROMPTS[3] + "\n")
    want = server.text(server.reference(ids, 20))
    out = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)  # type: ignore[arg-type]
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == want
    assert out.usage is not None and out.usage.prompt_tokens == len(ids)
    stream = c.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=20,
        temperature=0,  # type: ignore[arg-type]
        stream=True,
    )
    deltas = [ch.choices[0].delta for ch in stream if ch.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == want


def test_seeded_sampling_reproduces(server: Running) -> None:
    c = client(server)
    runs = [
        c.completions.create(
            model=MODEL,
            prompt=PROMPTS[4],
            max_tokens=24,
            temperature=1.0,
            top_p=0.9,
            seed=seed,
            extra_body={"top_k": 50},
        )
        .choices[0]
        .text
        for seed in (11, 11, 12, 13)
    ]
    assert runs[0] == runs[1]
    assert len(set(runs)) > 1  # other seeds draw other tokens
    stream = c.completions.create(
        model=MODEL,
        prompt=PROMPTS[4],
        max_tokens=24,
        temperature=1.0,
        top_p=0.9,
        seed=11,
        stream=True,
        extra_body={"top_k": 50},
    )
    assert "".join(ch.choices[0].text for ch in stream if ch.choices) == runs[0]


def test_stop_strings_cut_the_text(server: Running) -> None:
    c = client(server)
    full = c.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=24, temperature=0).choices[0].text
    words = full.split()
    stop = " " + words[len(words) // 2]
    cut = full[: full.find(stop)]
    out = c.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=24, temperature=0, stop=[stop])
    assert out.choices[0].text == cut and out.choices[0].finish_reason == "stop"
    stream = c.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=24, temperature=0, stop=stop, stream=True
    )
    assert "".join(ch.choices[0].text for ch in stream if ch.choices) == cut


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", b"{not json", 400, None),
        ("/v1/completions", b"[1, 2]", 400, None),
        ("/v1/completions", b'{"prompt": "a", "model": "gpt-4"}', 404, "model"),
        ("/v1/completions", b'{"prompt": "a", "temperature": 3}', 400, "temperature"),
        ("/v1/completions", b'{"prompt": "a", "top_p": 0}', 400, "top_p"),
        ("/v1/completions", b'{"prompt": "a", "top_k": -5}', 400, "top_k"),
        ("/v1/completions", b'{"prompt": "a", "max_tokens": 0}', 400, "max_tokens"),
        ("/v1/completions", b'{"prompt": "a", "max_tokens": 100000000}', 400, "max_tokens"),
        ("/v1/completions", b'{"prompt": "a", "seed": -1}', 400, "seed"),
        ("/v1/completions", b'{"prompt": "a", "n": 2}', 400, "n"),
        ("/v1/completions", b'{"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}', 400, "stop"),
        ("/v1/completions", b'{"prompt": [1, 99999]}', 400, "prompt"),
        ("/v1/completions", b'{"prompt": ["a", "b"]}', 400, "prompt"),
        ("/v1/completions", b'{"prompt": []}', 400, "prompt"),
        ("/v1/completions", b'{"max_tokens": 3}', 400, "prompt"),
        ("/v1/completions", b'{"prompt": "a", "presence_penalty": 1}', 400, "presence_penalty"),
        ("/v1/chat/completions", b'{"messages": []}', 400, "messages"),
        ("/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "a"}]}', 400, "messages.0"),
        ("/v1/chat/completions", b'{"messages": "hello"}', 400, "messages"),
    ],
)
def test_bad_input_is_refused_naming_the_field(
    server: Running, path: str, body: bytes, status: int, param: str | None
) -> None:
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"]
    assert httpx.get(server.url + "/health", timeout=10).json() == {"status": "ok"}


def test_unknown_route_and_method_are_json_errors(server: Running) -> None:
    r = httpx.get(server.url + "/v1/nothing", timeout=10)
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(server.url + "/v1/completions", timeout=10)
    assert r.status_code == 405 and "error" in r.json()


def test_queue_full_is_429_with_retry_after(server: Running) -> None:
    server.scheduler.max_queue = 0
    try:
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}, timeout=10)
    finally:
        server.scheduler.max_queue = 512
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "rate_limit_error"


def test_a_client_that_disconnects_leaves_the_batch(server: Running) -> None:
    before = (
        metric(httpx.get(server.url + "/metrics").text, 'kakeya_requests_finished_total{reason="cancelled"}')
        if "cancelled" in httpx.get(server.url + "/metrics").text
        else 0.0
    )
    body = {"prompt": PROMPTS[1], "max_tokens": 60000, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in got)
    deadline = time.monotonic() + 20
    while True:
        text = httpx.get(server.url + "/metrics").text
        if metric(text, "kakeya_running_sequences") == 0 and "cancelled" in text:
            break
        assert time.monotonic() < deadline, "the disconnected row never left the batch"
        time.sleep(0.05)
    assert metric(text, 'kakeya_requests_finished_total{reason="cancelled"}') == before + 1


@pytest.mark.slow
def test_200_concurrent_clients_with_disconnects_are_exact_and_within_budget(server: Running) -> None:
    rng = random.Random(3)
    prompts = [server.model.encode(p) for p in corpus.code_prompts(10, 11, 24)]
    want = {(i, n): server.reference(prompts[i], n) for i in range(len(prompts)) for n in (4, 9, 16)}
    jobs = [
        (rng.randrange(len(prompts)), rng.choice((4, 9, 16)), rng.random() < 0.5, rng.random() < 0.15)
        for _ in range(200)
    ]

    async def one(http: httpx.AsyncClient, i: int, n: int, stream: bool, leave: bool) -> str | None:
        body = {"prompt": prompts[i], "max_tokens": n, "temperature": 0, "stream": stream}
        if not stream and not leave:
            r = await http.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            data = r.json()
            assert data["usage"]["completion_tokens"] == len(want[i, n])
            return str(data["choices"][0]["text"])
        text = ""
        async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if leave:  # a client that goes away mid-stream
                    return None
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    text += chunk["choices"][0]["text"] if chunk["choices"] else ""
        return text

    async def main() -> list[str | None]:
        limits = httpx.Limits(max_connections=250, max_keepalive_connections=250)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as http:
            return await asyncio.gather(*(one(http, *job) for job in jobs))

    results = asyncio.run(main())
    for (i, n, _, leave), got in zip(jobs, results, strict=True):
        if not leave:
            assert got == server.text(want[i, n]), (i, n)
    deadline = time.monotonic() + 20
    while metric(text := httpx.get(server.url + "/metrics").text, "kakeya_running_sequences") > 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert metric(text, "kakeya_kv_bytes_held_max") <= server.config.kv_budget
    assert metric(text, "kakeya_kv_bytes_held_max") > 0
    assert metric(text, "kakeya_kv_bytes_reserved") == 0 and metric(text, "kakeya_queue_depth") == 0
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
