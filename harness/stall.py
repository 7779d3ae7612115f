"""Heavy or hostile work against the front, and what is measured beside it
(issue 49): the classes that once stalled the ingress, each a workload of
threads over real HTTP, and `Beside`, the probes that run while one does:
`/healthz` every `health_every_s` (its p99), a normal small image read one
request after another from another client address (its worst time and
statuses), and the PSS of the ingress and of every process of the
service, sampled (peak growth over the value before). The front-stall
tests (tests/integration/test_front_stall.py) and `python -m load_tests
hostile front` share them. No pytest import."""

from __future__ import annotations

import io
import math
import os
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import requests
from requests.adapters import HTTPAdapter

from harness.procfs import descendants, pss_mb

OTHER_ADDRESS = "127.0.0.2"  # the normal client: another address, so another client for the fair shares
NEWCOMER_ADDRESS = "127.0.0.3"  # a third client: the one-image job beside another client's flood


class SourceAddressAdapter(HTTPAdapter):
    """requests from another loopback address: another client."""

    def __init__(self, address: str, **kw):
        self.address = address
        super().__init__(**kw)

    def init_poolmanager(self, *args, **kw):
        kw["source_address"] = (self.address, 0)
        super().init_poolmanager(*args, **kw)


def session_from(address: Optional[str] = None) -> requests.Session:
    s = requests.Session()
    if address:
        s.mount("http://", SourceAddressAdapter(address))
    return s


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank; NaN for none."""
    if not values:
        return math.nan
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q / 100 * len(v)) - 1))]


def tree_pss_mb(pids: list[int]) -> float:
    """PSS of processes and their descendants (the PDF and render children), MB."""
    seen: set[int] = set()
    for p in pids:
        seen.add(p)
        seen.update(descendants(p))
    total = 0.0
    for p in seen:
        m = pss_mb(p)
        total += m["pss"] if m else 0.0
    return total


@dataclass
class BesideReport:
    healthz_ms: list[float] = field(default_factory=list)
    healthz_codes: list[int] = field(default_factory=list)
    normal: list[tuple[int, float]] = field(default_factory=list)  # (status, seconds)
    refusals: list[str] = field(default_factory=list)  # the normal request's error bodies (why it was not a 200)
    slowest: Optional[tuple[float, dict]] = None  # the slowest 200's seconds and its answer's timings_ms (where it waited)
    ingress_growth_mb: float = 0.0
    service_growth_mb: float = 0.0

    @property
    def healthz_p99_ms(self) -> float:
        return percentile(self.healthz_ms, 99)

    @property
    def normal_worst_s(self) -> float:
        return max((s for _, s in self.normal), default=math.nan)

    def line(self) -> str:
        codes = sorted({c for c, _ in self.normal})
        return (f"/healthz p99 {self.healthz_p99_ms:.0f} ms (max {max(self.healthz_ms, default=math.nan):.0f}, "
                f"n {len(self.healthz_ms)}); normal {len(self.normal)} x {codes} worst {self.normal_worst_s:.2f} s; "
                f"ingress PSS +{self.ingress_growth_mb:.0f} MB, service +{self.service_growth_mb:.0f} MB"
                + (f"; refused: {self.refusals[:3]}" if self.refusals else "")
                + (f"; slowest 200's timings_ms: {self.slowest[1]}" if self.slowest and self.slowest[0] > 1 else ""))


class Beside:
    """The probes beside a workload, while the `with` block runs (see the
    module's doc). `ingress`: the ingress replica's pid; `service`: every
    replica's (and the proxy's) pid: their descendants are counted too."""

    def __init__(self, url: str, small: bytes, headers: dict, ingress: Optional[int] = None,
                 service: Optional[list[int]] = None, health_every_s: float = 0.1, normal_every_s: float = 0.5,
                 sample_every_s: float = 0.2):
        self.url, self.small, self.headers = url, small, headers
        self.ingress, self.service = ingress, list(service or [])
        self.health_every_s, self.normal_every_s, self.sample_every_s = health_every_s, normal_every_s, sample_every_s
        self.report = BesideReport()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _health(self) -> None:
        s = requests.Session()
        while not self._stop.is_set():
            t = time.perf_counter()
            try:
                code = s.get(f"{self.url}/healthz", timeout=30).status_code
            except Exception:
                code = 0
            self.report.healthz_ms.append((time.perf_counter() - t) * 1000)
            self.report.healthz_codes.append(code)
            self._stop.wait(self.health_every_s)

    def _normal(self) -> None:
        s = session_from(OTHER_ADDRESS)
        while not self._stop.is_set():
            t = time.perf_counter()
            try:
                r = s.post(f"{self.url}/v1/ocr", data=self.small,
                           headers={"Content-Type": "image/jpeg", "Cache-Control": "no-cache", **self.headers},
                           timeout=120)
                code = r.status_code
                if code != 200:
                    self.report.refusals.append(f"{code}: {r.text[:300]}")
            except Exception as e:
                code = 0
                self.report.refusals.append(f"0: {e!r}"[:300])
            took = time.perf_counter() - t
            self.report.normal.append((code, took))
            if code == 200 and (self.report.slowest is None or took > self.report.slowest[0]):
                self.report.slowest = (took, r.json().get("timings_ms", {}))
            self._stop.wait(self.normal_every_s)

    def _memory(self) -> None:
        base_i = pss_mb(self.ingress)["pss"] if self.ingress and pss_mb(self.ingress) else 0.0
        base_s = tree_pss_mb(self.service) if self.service else 0.0
        while not self._stop.is_set():
            if self.ingress:
                m = pss_mb(self.ingress)
                if m:
                    self.report.ingress_growth_mb = max(self.report.ingress_growth_mb, m["pss"] - base_i)
            if self.service:
                self.report.service_growth_mb = max(self.report.service_growth_mb, tree_pss_mb(self.service) - base_s)
            self._stop.wait(self.sample_every_s)

    def __enter__(self) -> "Beside":
        for fn in (self._memory, self._health, self._normal):
            t = threading.Thread(target=fn, daemon=True)
            t.start()
            self._threads.append(t)
        time.sleep(0.3)  # the memory baseline taken before the workload starts
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def loop_threads(n: int, seconds: float, one: Callable[[int, requests.Session], None],
                 address: Optional[str] = None) -> None:
    """`one(k, session)` called over and over by n threads for `seconds`,
    each thread at nice 19: the heavy clients stand for clients elsewhere,
    and on the service's own box their uploading and reading (up to a core
    for 4 threads sending 18 MB bodies) must not be taken from the service
    under test, whose processes Ray runs at nice 15."""
    end = time.monotonic() + seconds

    def run(k: int) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass
        s = session_from(address)
        while time.monotonic() < end:
            one(k, s)

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# -- the heavy things ------------------------------------------------------------------


def long_text_pdf(pages: int, lines: int = 120, chars: int = 60) -> bytes:
    """A PDF whose text layer is `pages` x `lines` lines of `chars`
    characters (its result is large, read without OCR: options.pdf_text_layer)."""
    from harness.pdfs import text_pdf

    words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor".split()
    body = []
    for p in range(pages):
        page = []
        for k in range(lines):
            text = " ".join(words[(p + k + j) % len(words)] for j in range(chars // 6))
            page.append(f"{p}.{k} {text}"[:chars])
        body.append(page)
    return text_pdf(body, size_pt=(612, 40 + int(lines * 6 * 1.8) + 20), font_pt=6)


def many_chunks_png(chunks: int = 200, image: Optional[bytes] = None) -> bytes:
    """A small real PNG with `chunks` empty private chunks before its image
    data (under the door's bound: accepted, each walked)."""
    from PIL import Image

    if image is None:
        buf = io.BytesIO()
        Image.new("L", (64, 32), 255).save(buf, "PNG")
        image = buf.getvalue()
    c = struct.pack(">I", 0) + b"prVt" + struct.pack(">I", zlib.crc32(b"prVt"))
    return image[:33] + c * chunks + image[33:]


def dots_page(cols: int = 40, rows: int = 40, cell: int = 48) -> bytes:
    """A page of isolated letters on a grid (each its own detected box, the
    gaps between them wide enough to be gutters): the boxes that made the
    layout step's column cuts cost more than quadratic time."""
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("L", (cols * cell, rows * cell), 255)
    d = ImageDraw.Draw(img)
    try:
        font = ImageFont.truetype("DejaVuSans-Bold.ttf", cell // 2)
    except OSError:
        font = ImageFont.load_default()
    for r in range(rows):
        for c in range(cols):
            d.text((c * cell + cell // 4, r * cell + cell // 5), "ABCDEFGHKMNPRSTUVWXYZ"[(r * 7 + c) % 21],
                   fill=0, font=font)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def pids_of_service() -> tuple[Optional[int], list[int]]:
    """(the ingress's pid, every replica's and the proxy's pid)."""
    import ray

    from harness.service import replica_pids

    found = replica_pids(["OcrIngress", "OcrPipeline", "JobStore", "TextRecognizer", "TextDetector",
                          "DirectionClassifier"])
    pids = [p for ps in found.values() for p in ps]
    for a in ray.util.list_named_actors(all_namespaces=True):
        if "SERVE_PROXY_ACTOR" in a["name"]:
            actor = ray.get_actor(a["name"], namespace=a["namespace"])
            pids.append(ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=30))
    ingress = found.get("OcrIngress", [None])[0]
    return ingress, pids


def wait_job(url: str, job_id: str, headers: dict, bound_s: float = 300.0) -> dict:
    t = time.monotonic()
    while time.monotonic() - t < bound_s:
        view = requests.get(f"{url}/v1/ocr/jobs/{job_id}", headers=headers, timeout=60).json()
        if view["status"] in ("succeeded", "failed"):
            return view
        time.sleep(0.5)
    raise TimeoutError(f"job {job_id} not done within {bound_s:.0f} s")


def multipage_tiff(pages: int = 4) -> bytes:
    """A `pages`-page 1-bit G4 TIFF of the made columns page (~40 KB; each
    page 1.2 x 1.7 k px decoded)."""
    from harness.pages import columns_page, fax_tiff

    page = columns_page(2)
    return fax_tiff([page] * pages)


def big_chunks_png(chunks: int = 250, chunk_bytes: int = 76_000) -> bytes:
    """A 64 x 32 PNG with `chunks` private chunks of `chunk_bytes` before its
    image data (19 MB, under the door's 256-chunk bound: accepted and
    walked, each chunk's CRC checked by the header read)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (64, 32), 255).save(buf, "PNG")
    image = buf.getvalue()
    data = b"\0" * chunk_bytes
    c = struct.pack(">I", chunk_bytes) + b"prVt" + data + struct.pack(">I", zlib.crc32(b"prVt" + data))
    return image[:33] + c * chunks + image[33:]


# -- the service these run against ---------------------------------------------------------

FRONT = "deployments.light.yaml, front"  # SharedServices name of the front-stall test's service
FRONT_TOKEN = "front-stall-token"
NAMED_TOKENS = [f"reader{k}:front-named-token-{k:02d}" for k in range(16)]
PAGE_TIMEOUT_S = 2.0


def front_config() -> dict:
    """The light profile (`make serve`'s) behind a bearer token and 16 named
    tokens (clients reader0..reader15), a 2 s page budget (a render bomb
    is given up quickly)."""
    from harness.service import REPO, load_config

    cfg = load_config(REPO / "deployments.light.yaml")
    app = cfg["applications"][0]
    app["runtime_env"] = {"env_vars": {"OCR_FRONT_TOKEN": FRONT_TOKEN, "OCR_FRONT_NAMED": " ".join(NAMED_TOKENS)}}
    app["args"]["ingress"] = {**app["args"].get("ingress", {}), "auth_token_env": "OCR_FRONT_TOKEN",
                              "client_tokens_env": "OCR_FRONT_NAMED"}
    engine = app["args"].setdefault("engine", {})
    engine["documents"] = {**engine.get("documents", {}), "page_timeout_s": PAGE_TIMEOUT_S}
    return cfg


@dataclass
class Front:
    """A started service as the classes use it."""

    url: str
    small: bytes
    ingress: Optional[int] = None
    pids: list[int] = field(default_factory=list)
    token: str = FRONT_TOKEN
    big_job: Optional[str] = None  # a finished job with a large result (big_job_id)

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"}

    def beside(self, **kw) -> Beside:
        return Beside(self.url, self.small, self.auth, self.ingress, self.pids, **kw)


def big_job_id(front: Front, pages: int = 60) -> str:
    """A finished job whose result is large (`pages` text-layer pages of 120
    lines: 1 MB of JSON, 8.7 MB as hOCR), made once per service."""
    import base64
    import json

    if front.big_job is None:
        body = json.dumps({"image": {"base64": base64.b64encode(long_text_pdf(pages)).decode()},
                           "options": {"pdf_text_layer": True}})
        r = requests.post(f"{front.url}/v1/ocr/jobs", data=body,
                          headers={"Content-Type": "application/json", **front.auth}, timeout=120)
        r.raise_for_status()
        job = r.json()["job_id"]
        view = wait_job(front.url, job, front.auth)
        if view["status"] != "succeeded":
            raise RuntimeError(f"the large job failed: {view.get('error')}")
        front.big_job = job
    return front.big_job


# -- the classes -------------------------------------------------------------------------------


def _count(codes: list[int]) -> dict[int, int]:
    return {c: codes.count(c) for c in sorted(set(codes))}


def readers(front: Front, seconds: float, n: int = 16, fmt: str = "hocr") -> dict:
    """n readers fetching one large finished job as `fmt`, each in a loop."""
    job = big_job_id(front)
    codes: list[int] = []
    sizes: set[int] = set()

    def one(_k: int, s: requests.Session) -> None:
        try:
            r = s.get(f"{front.url}/v1/ocr/jobs/{job}?format={fmt}", headers=front.auth, timeout=120)
            codes.append(r.status_code)
            if r.status_code == 200:
                sizes.add(len(r.content))
            else:
                time.sleep(min(2.0, float(r.headers.get("retry-after", "1"))))
        except Exception:
            codes.append(0)

    loop_threads(n, seconds, one)
    return {"sent": f"{n} readers of a {min(sizes, default=0) / 2**20:.1f} MB {fmt} job result", "codes": _count(codes)}


def probes(front: Front, seconds: float, n: int = 8) -> dict:
    """n clients polling /readyz and /v1/stats (each every 0.1 s) while one
    client reads dense pages (the pipeline, which answers the readiness
    probe, busy)."""
    from harness.peer import PEER

    dense = (PEER / "paddleocr_00018069.jpg").read_bytes()
    codes: list[int] = []
    ready_ms: list[float] = []

    def one(k: int, s: requests.Session) -> None:
        try:
            if k == 0:
                r = s.post(f"{front.url}/v1/ocr", data=dense, headers={"Content-Type": "image/jpeg",
                                                                      "Cache-Control": "no-cache", **front.auth},
                           timeout=120)
            else:
                t = time.perf_counter()
                path = "/readyz" if k % 2 else "/v1/stats"
                r = s.get(f"{front.url}{path}", headers=front.auth, timeout=60)
                if path == "/readyz":
                    ready_ms.append((time.perf_counter() - t) * 1000)
                time.sleep(0.1)
            codes.append(r.status_code)
        except Exception:
            codes.append(0)

    loop_threads(n + 1, seconds, one)
    return {"sent": f"{n} clients polling /readyz and /v1/stats every 0.1 s, 1 reading dense pages",
            "codes": _count(codes), "readyz_p99_ms": percentile(ready_ms, 99)}


def submits(front: Front, seconds: float, n: int = 4) -> dict:
    """n clients submitting 19 MB PNG jobs of 250 chunks before the image
    data, and one client rotating through 16 named tokens fetching a
    finished job's result."""
    body = big_chunks_png()
    job = big_job_id(front)
    codes: list[int] = []

    def one(k: int, s: requests.Session) -> None:
        try:
            if k < n:
                r = s.post(f"{front.url}/v1/ocr/jobs", data=body,
                           headers={"Content-Type": "image/png", **front.auth}, timeout=120)
            else:
                token = NAMED_TOKENS[int(time.monotonic() * 10) % len(NAMED_TOKENS)].split(":", 1)[1]
                r = s.get(f"{front.url}/v1/ocr/jobs/{job}?format=text", headers={"Authorization": f"Bearer {token}"},
                          timeout=120)
            codes.append(r.status_code)
            if r.status_code == 503:
                time.sleep(min(2.0, float(r.headers.get("retry-after", "1"))))
        except Exception:
            codes.append(0)

    loop_threads(n + 1, seconds, one)
    return {"sent": f"{n} submitters of {len(body) / 2**20:.0f} MB PNGs of 250 chunks; 1 reader rotating 16 tokens",
            "codes": _count(codes)}


def layout(front: Front, seconds: float, n: int = 2) -> dict:
    """n clients reading a page of 1,600 lone letters (a box each, gaps
    wide enough to be gutters), one request after another."""
    body = dots_page()
    codes: list[int] = []
    lines: set[int] = set()

    def one(_k: int, s: requests.Session) -> None:
        try:
            r = s.post(f"{front.url}/v1/ocr", data=body, headers={"Content-Type": "image/png",
                                                                  "Cache-Control": "no-cache", **front.auth},
                       timeout=300)
        except Exception:
            codes.append(0)
            return
        codes.append(r.status_code)
        if r.status_code == 200:
            lines.add(len(r.json()["results"]))
        elif r.status_code == 503:
            time.sleep(min(2.0, float(r.headers.get("retry-after", "1"))))

    loop_threads(n, seconds, one)
    return {"sent": f"{n} clients reading a page of 1,600 lone letters", "codes": _count(codes),
            "lines": sorted(lines)}


def documents(front: Front, seconds: float, tiffs: int = 100) -> dict:
    """A 500-page PDF render bomb and `tiffs` 4-page TIFF jobs from one
    client, submitted at once; the service then works on them."""
    from harness.pdfs import nested_forms_pdf

    bomb = nested_forms_pdf(depth=7, pages=500)
    tiff = multipage_tiff(4)
    codes: list[int] = []
    s = requests.Session()
    r = s.post(f"{front.url}/v1/ocr/jobs", data=bomb, headers={"Content-Type": "application/pdf", **front.auth},
               timeout=120)
    codes.append(r.status_code)
    for _ in range(tiffs):
        r = s.post(f"{front.url}/v1/ocr/jobs", data=tiff, headers={"Content-Type": "image/tiff", **front.auth},
                   timeout=120)
        codes.append(r.status_code)
    time.sleep(max(0.0, seconds))
    return {"sent": f"a 500-page PDF render bomb and {tiffs} 4-page TIFFs ({len(tiff) / 1024:.0f} KB each) as jobs",
            "codes": _count(codes)}


def _submit(front: Front, body: bytes, ctype: str, session: Optional[requests.Session] = None) -> requests.Response:
    return (session or requests).post(f"{front.url}/v1/ocr/jobs", data=body,
                                      headers={"Content-Type": ctype, **front.auth}, timeout=120)


def watch_job(front: Front, job_id: str, since: float, bound_s: float,
              session: Optional[requests.Session] = None) -> dict:
    """A job polled every 0.25 s until it ends or `bound_s` after `since`
    (time.monotonic()): {"status", "started_s", "ended_s"} (seconds after
    `since`; None: not seen)."""
    s = session or requests.Session()
    started = ended = None
    status = "?"
    while time.monotonic() - since < bound_s:
        try:
            status = s.get(f"{front.url}/v1/ocr/jobs/{job_id}", headers=front.auth, timeout=30).json()["status"]
        except Exception:
            status = "?"
        now = time.monotonic() - since
        if status != "queued" and status != "?" and started is None:
            started = now
        if status in ("succeeded", "failed"):
            ended = now
            break
        time.sleep(0.25)
    return {"status": status, "started_s": started, "ended_s": ended}


def flood(front: Front, seconds: float, tiffs: int = 100) -> dict:
    """One client's `tiffs` 4-page TIFF jobs, then another client's
    one-image job: when that one started and ended after its submit."""
    tiff = multipage_tiff(4)
    codes = [_submit(front, tiff, "image/tiff").status_code for _ in range(tiffs)]
    other = session_from(NEWCOMER_ADDRESS)
    t0 = time.monotonic()
    r = _submit(front, front.small, "image/jpeg", other)
    codes.append(r.status_code)
    seen = watch_job(front, r.json()["job_id"], t0, max(90.0, seconds), other) if r.status_code == 202 else {}
    time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    return {"sent": f"{tiffs} 4-page TIFF jobs ({len(tiff) / 1024:.0f} KB each) from one client, then another "
                    f"client's one-image job", "codes": _count(codes),
            "newcomer": {k: (round(v, 1) if isinstance(v, float) else v) for k, v in seen.items()}}


def tiled(front: Front, seconds: float, pages: int = 40) -> dict:
    """A job of a `pages`-page TIFF of 16 MP pages stored as 16 x 16 px
    tiles (62,500 a page; harness.pages.tiled_tiff): when it ended."""
    from harness.pages import tiled_tiff

    body = tiled_tiff(pages)
    t0 = time.monotonic()
    r = _submit(front, body, "image/tiff")
    seen = watch_job(front, r.json()["job_id"], t0, max(90.0, seconds)) if r.status_code == 202 else {}
    time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    return {"sent": f"a {pages}-page TIFF of 16 MP pages in 16 x 16 px tiles ({len(body) / 2**20:.0f} MB) as a job",
            "codes": _count([r.status_code]), "job": {k: (round(v, 1) if isinstance(v, float) else v)
                                                      for k, v in seen.items()}}


def bomb(front: Front, seconds: float, pages: int = 500) -> dict:
    """A job of a `pages`-page PDF whose every page burns its render budget,
    and meanwhile another client reading a one-page PDF one request after
    another: that PDF's worst time, and when the bomb's job ended."""
    from harness.pdfs import blank_pdf, nested_forms_pdf

    one = blank_pdf(1, (595, 842))
    t0 = time.monotonic()
    r = _submit(front, nested_forms_pdf(depth=7, pages=pages), "application/pdf")
    job = r.json()["job_id"] if r.status_code == 202 else None
    pdf_codes: list[int] = []
    pdf_s: list[float] = []

    def one_pdf(_k: int, s: requests.Session) -> None:
        t = time.perf_counter()
        try:
            code = s.post(f"{front.url}/v1/ocr", data=one, headers={"Content-Type": "application/pdf",
                                                                    "Cache-Control": "no-cache", **front.auth},
                          timeout=120).status_code
        except Exception:
            code = 0
        pdf_codes.append(code)
        pdf_s.append(time.perf_counter() - t)
        time.sleep(0.5)

    seen: dict = {}
    watcher = threading.Thread(target=lambda: seen.update(watch_job(front, job, t0, max(90.0, seconds))),
                               daemon=True)
    if job:
        watcher.start()  # beside the one-page PDFs: when the job started and ended
    loop_threads(1, seconds, one_pdf, address=NEWCOMER_ADDRESS)
    if job:
        watcher.join()
    return {"sent": f"a {pages}-page PDF of render-bomb pages as a job; another client's one-page PDF beside it",
            "codes": _count([r.status_code]), "one_page_pdf": {"codes": _count(pdf_codes),
                                                               "worst_s": round(max(pdf_s, default=math.nan), 2)},
            "job": {k: (round(v, 1) if isinstance(v, float) else v) for k, v in seen.items()}}


def door(front: Front, seconds: float, n: int = 2, pages: int = 199) -> dict:
    """n clients sending, one request after another, a `pages`-page TIFF
    whose first page is 16 x 16 px and the rest 16 MP (in 256 px tiles: a
    small file) to the sync API: priced at the door from every page's
    directory (a 503 naming the jobs API)."""
    from harness.pages import tiled_tiff

    body = tiled_tiff(pages, tile=256, first=16)
    codes: list[int] = []
    worst = [0.0]

    def one(_k: int, s: requests.Session) -> None:
        t = time.perf_counter()
        try:
            r = s.post(f"{front.url}/v1/ocr", data=body, headers={"Content-Type": "image/tiff", **front.auth},
                       timeout=120)
            codes.append(r.status_code)
        except Exception:
            codes.append(0)
        worst[0] = max(worst[0], time.perf_counter() - t)
        time.sleep(0.2)

    loop_threads(n, seconds, one)
    return {"sent": f"{n} clients sending a {pages}-page TIFF (first page 16 x 16, the rest 16 MP; "
                    f"{len(body) / 1024:.0f} KB) to /v1/ocr", "codes": _count(codes), "worst_s": round(worst[0], 2)}


CLASSES: dict[str, Callable[[Front, float], dict]] = {
    "readers": readers, "probes": probes, "submits": submits, "layout": layout, "door": door, "tiled": tiled,
    "bomb": bomb, "documents": documents, "flood": flood,
}


def run_class(front: Front, name: str, seconds: float, **kw) -> tuple[dict, BesideReport]:
    """One class's workload for about `seconds` (`kw`: the class's own
    arguments), the probes beside it."""
    if name in ("readers", "submits"):
        big_job_id(front)  # made before the probes start
    with front.beside() as beside:
        outcome = CLASSES[name](front, seconds, **kw)
    return outcome, beside.report


def started(url: str, small: bytes) -> Front:
    ingress, pids = pids_of_service()
    return Front(url, small, ingress, pids)
