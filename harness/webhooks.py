"""A real webhook receiver for the callback tests: an HTTP server on
127.0.0.1 in the test process (its own threads), answering each POST with
the next status of a script (then 200), keeping every request it got
(headers, body, time). A status of HANG holds the answer until `release()`.
Started on a given port it can stand for a receiver that comes up late
(connections to the port are refused before)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

from harness.redis_server import free_port

HANG = -1
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # the tests' signing secret (Standard Webhooks' example form)


class Receiver:
    def __init__(self, answers: tuple[int, ...] = (), port: Optional[int] = None, location: str = "",
                 host: str = "127.0.0.1"):
        self.host = host
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}/hook"
        self.answers = list(answers)
        self.location = location
        self.events: list[tuple[dict, bytes, float]] = []
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._server: Optional[ThreadingHTTPServer] = None

    def start(self) -> "Receiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    receiver.events.append(({k.lower(): v for k, v in self.headers.items()}, body, time.time()))
                    status = receiver.answers.pop(0) if receiver.answers else 200
                if status == HANG:
                    receiver._released.wait(120)
                    status = 200
                self.send_response(status)
                if receiver.location and 300 <= status < 400:
                    self.send_header("Location", receiver.location)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def release(self) -> None:
        self._released.set()

    def stop(self) -> None:
        self._released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "Receiver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
