"""A built server on a free 127.0.0.1 port in a thread of this process (uvicorn's own server loop, the same
HTTP stack as `python -m engine.serve`): for the serving workload and the tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def in_thread(app: Any, scheduler: Any, start_timeout: float = 30) -> Iterator[str]:
    """Start the scheduler and serve `app` on 127.0.0.1; yields the base URL; stops both on exit."""
    import uvicorn

    scheduler.start()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, name="kakeya-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    try:
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        scheduler.stop()
