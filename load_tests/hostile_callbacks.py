"""Benchmark: job callbacks and page streams beside a stranger's worst
(issue 59). The real HTTP app over a Front and a real SQLite job book,
served by uvicorn on 127.0.0.1 in this process, with real receivers; the
pipeline is a stand-in that answers at once (a document of --pages pages):
it measures the book's and the stream's bounds, not the models, so it runs
without Ray (no lock needed).

    python -m load_tests hostile callbacks [--pages 2000 --readers 8 --seconds 10]

First /healthz alone (every 20 ms for --seconds: the baseline), then
`deliveries`: client 127.0.0.2 submits jobs calling back a black hole (a
port that never answers) until refused (jobs.callbacks.max_pending_per_client)
while 127.0.0.3 submits --jobs jobs to a receiver that answers: are all of
the second client's jobs accepted and delivered, in what time; and
`streams`: --readers slow readers (1 KiB every 0.1 s) of a finished
document's page stream beside /healthz every 20 ms: its p50 and p99 and
this process's RSS growth. One markdown table and whether each case holds
(every delivery of the other client made; /healthz p99 under 100 ms)."""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import threading
import time
import types
from typing import Any

from load_tests.cli import standalone

HEALTHZ_P99_MS = 100.0


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=10.0, help="the baseline's and the streams case's length")
    p.add_argument("--pages", type=int, default=2000, help="the streamed document's pages")
    p.add_argument("--readers", type=int, default=8, help="slow readers of its page stream")
    p.add_argument("--jobs", type=int, default=20, help="the other client's jobs with a callback")


class Document:
    """The stand-in pipeline: any input answers at once; a PDF with `pages` pages of 20 lines each."""

    def __init__(self, pages: int):
        self.pages = pages

    async def run(self, image, options, progress=None):
        if not bytes(image[:5]) == b"%PDF-":
            return {"image": {"width": 8, "height": 8}, "results": []}
        lines = [{"text": f"line {k} of a page", "confidence": 0.9, "box": [[0, k], [99, k], [99, k + 9], [0, k + 9]]}
                 for k in range(20)]
        return {"document": {"type": "pdf", "pages": self.pages},
                "pages": [{"page": n, "width": 1240, "height": 1754, "source": "ocr", "results": lines}
                          for n in range(1, self.pages + 1)]}


def probe_healthz(url: str, seconds: float) -> list[float]:
    """/healthz every 20 ms for `seconds`: each answer's time (ms); an error counts as 10 s."""
    import requests

    out = []
    end = time.monotonic() + seconds
    with requests.Session() as s:
        while time.monotonic() < end:
            t = time.perf_counter()
            try:
                ok = s.get(f"{url}/healthz", timeout=10).status_code == 200
            except requests.RequestException:
                ok = False
            out.append((time.perf_counter() - t) * 1000 if ok else 10_000.0)
            time.sleep(0.02)
    return out


def slow_reader(url: str, path: str, seconds: float, got: list, source: str) -> None:
    """GET `path` from `source` (a client of its own) and read 1 KiB every
    0.1 s for `seconds`; appends (the answer's status line, bytes read)."""
    host, port = url.split("//")[1].split(":")
    n, head = 0, b""
    try:
        with socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0)) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                chunk = s.recv(1024)
                if not chunk:
                    break
                head = head or chunk.split(b"\r\n", 1)[0]
                n += len(chunk)
                time.sleep(0.1)
    except OSError:
        pass
    got.append((head.decode(errors="replace"), n))


def post_job(url: str, source: str, body: bytes, callback: str) -> int:
    from harness.stall import session_from

    with session_from(source) as s:
        r = s.post(f"{url}/v1/ocr/jobs", params={"callback_url": callback}, data=body,
                   headers={"Content-Type": "image/png"}, timeout=30)
    return r.status_code


def serve_front(book) -> Any:
    """The real HTTP app over a Front whose job store is `book` (its calls in this loop)."""
    from harness.front import Method, stand_in_front
    from serve_app.http.app import build_app

    async def head(job_id):
        raw = await book.get_raw(job_id)
        return None if raw is None else (raw[0], None if raw[1] is None else len(raw[1]))

    front = stand_in_front()
    front.jobs = types.SimpleNamespace(submit=Method(book.submit), get=Method(book.get), get_raw=Method(book.get_raw),
                                       page=Method(book.page), head=Method(head))
    return build_app(front)


async def run_cases(args: argparse.Namespace, tmp: str) -> dict:
    import os

    import requests
    import uvicorn

    from harness.hostile import png_strip
    from harness.pdfs import text_pdf
    from harness.procfs import rss_mb
    from harness.redis_server import free_port
    from harness.stall import percentile
    from harness.webhooks import SECRET, Receiver
    from serve_app.core.app_args import JobArgs
    from serve_app.jobs.book import JobBook

    os.environ["OCR_WEBHOOK_SECRET"] = SECRET
    per_client = max(2, args.jobs // 2)
    book = JobBook(Document(args.pages).run, JobArgs(
        journal=f"{tmp}/jobs.sqlite", capacity=1000, max_result_bytes=64 << 20,
        callbacks={"allow": ["127.0.0.0/8"], "timeout_s": 2.0, "retry_s": [30.0] * 4, "max_pending": 1000,
                   "max_pending_per_client": per_client, "public_url": "http://127.0.0.1"}))
    await book.start()
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    server = uvicorn.Server(uvicorn.Config(serve_front(book), host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    out: dict = {}
    try:
        base = await asyncio.to_thread(probe_healthz, url, args.seconds)
        out["baseline"] = (percentile(base, 50), percentile(base, 99))

        # -- deliveries: a black-holed client beside one whose receiver answers
        hole = socket.socket()  # a port that accepts connections (the kernel's backlog) and never answers
        hole.bind(("127.0.0.1", 0))
        hole.listen(1024)
        with Receiver(host="127.0.0.3") as hook:
            png = png_strip(8, 8)
            t0 = time.monotonic()
            a_codes = [await asyncio.to_thread(post_job, url, "127.0.0.2", png,
                                              f"http://127.0.0.1:{hole.getsockname()[1]}/hook")
                       for _ in range(per_client + 5)]
            b_codes = [await asyncio.to_thread(post_job, url, "127.0.0.3", png, hook.url) for _ in range(args.jobs)]
            deadline = time.monotonic() + 120
            while len(hook.events) < sum(c == 202 for c in b_codes) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            out["deliveries"] = {"a_codes": a_codes, "b_codes": b_codes, "b_delivered": len(hook.events),
                                 "b_seconds": time.monotonic() - t0}
        hole.close()

        # -- streams: slow readers of a long finished document beside /healthz
        job = (await asyncio.to_thread(lambda: requests.post(
            f"{url}/v1/ocr/jobs", data=text_pdf([["x"]]), headers={"Content-Type": "application/pdf"},
            timeout=30).json()))["job_id"]
        while (await book.get(job))["status"] not in ("succeeded", "failed"):
            await asyncio.sleep(0.05)
        rss0 = rss_mb(os.getpid())
        got: list = []
        readers = [threading.Thread(target=slow_reader, daemon=True,
                                    args=(url, f"/v1/ocr/jobs/{job}/pages", args.seconds, got, f"127.0.1.{k + 1}"))
                   for k in range(args.readers)]
        for t in readers:
            t.start()
        probes = await asyncio.to_thread(probe_healthz, url, args.seconds)
        rss1 = rss_mb(os.getpid())
        await asyncio.to_thread(lambda: [t.join(30) for t in readers])
        out["streams"] = {"p50": percentile(probes, 50), "p99": percentile(probes, 99), "read": got,
                          "rss_growth_mb": rss1 - rss0, "result_mb": len((await book.get_raw(job))[1]) / 2**20}
    finally:
        server.should_exit = True
        await serving
        book.close()
        await book.callbacks.aclose()
    return out


def report(args: argparse.Namespace, out: dict) -> bool:
    d, s = out["deliveries"], out["streams"]
    from load_tests.stats import md_table

    a, b_ok = d["a_codes"], sum(c == 202 for c in d["b_codes"])
    read, ok = [n for _, n in s["read"]], sum(" 200 " in h + " " for h, _ in s["read"])
    deliveries_hold = b_ok == len(d["b_codes"]) and d["b_delivered"] == b_ok
    streams_hold = s["p99"] < HEALTHZ_P99_MS and ok == len(s["read"])
    print(f"/healthz alone: p50 {out['baseline'][0]:.1f} ms, p99 {out['baseline'][1]:.1f} ms "
          f"(every 20 ms for {args.seconds:g} s)\n")
    print("\n".join(md_table(["case", "the stranger", "the other client / the probe", "holds"], [
        ["deliveries", f"{len(a)} black-holed submits: {a.count(202)} x 202, {a.count(503)} x 503",
         f"{b_ok}/{len(d['b_codes'])} accepted, {d['b_delivered']} delivered in {d['b_seconds']:.1f} s",
         "yes" if deliveries_hold else "NO"],
        ["streams", f"{args.readers} slow readers (each its own client) of a {args.pages}-page stream "
         f"({s['result_mb']:.1f} MB result; {ok} answered 200; {min(read) // 1024}-{max(read) // 1024} KiB read "
         f"each in {args.seconds:g} s; this process's RSS +{s['rss_growth_mb']:.0f} MB)",
         f"/healthz p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms (< {HEALTHZ_P99_MS:g})",
         "yes" if streams_hold else "NO"]], "llll")))
    return deliveries_hold and streams_hold


def main(args: argparse.Namespace) -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(run_cases(args, tmp))
    return 0 if report(args, out) else 1


def smoke(args: argparse.Namespace) -> int:
    """Both cases at a tiny scale (a few seconds): the run and the table."""
    args.seconds, args.pages, args.readers, args.jobs = 1.0, 50, 2, 4
    return main(args)


if __name__ == "__main__":
    sys.exit(standalone(__name__))
