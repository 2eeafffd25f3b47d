"""A real `kakeya serve` on a free 127.0.0.1 port, in a thread of the test process (uvicorn's own
server loop: the same HTTP stack as `python -m engine.serve`), and the references its output is
compared with: greedy decoding of each prompt alone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import engine
from engine.serve.config import ServeConfig
from engine.serve.thread import in_thread


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
    with in_thread(app, scheduler) as url:
        yield Running(url, scheduler, config)


def metric(text: str, name: str) -> float:
    """One sample's value from a Prometheus exposition (the first line starting with `name`)."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)
