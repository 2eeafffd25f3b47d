"""A real `kakeya serve` on a free 127.0.0.1 port, in a thread of the test process (uvicorn's own
server loop: the same HTTP stack as `python -m engine.serve`), and the references its output is
compared with: greedy decoding of each prompt alone."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

import engine
from engine.serve.config import ServeConfig


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Running:
    url: str  # http://127.0.0.1:PORT
    scheduler: Any
    config: ServeConfig

    @property
    def model(self) -> Any:
        return self.scheduler.engine.model

    def reference(self, prompt: list[int], max_tokens: int) -> list[int]:
        """Greedy tokens of `prompt` decoded alone under the server's policy."""
        session = self.model.session(self.config.policy, max_block=1)
        return engine.generate(session, prompt, engine.Stop(max_tokens, self.model.eos_ids)).tokens

    def text(self, tokens: list[int]) -> str:
        return str(self.model.tokenizer.decode(tokens, skip_special_tokens=True))


@contextlib.contextmanager
def serving(config: ServeConfig) -> Iterator[Running]:
    app, scheduler = config.build()
    scheduler.start()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield Running(f"http://127.0.0.1:{port}", scheduler, config)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        scheduler.stop()


def metric(text: str, name: str) -> float:
    """One sample's value from a Prometheus exposition (the first line starting with `name`)."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)
