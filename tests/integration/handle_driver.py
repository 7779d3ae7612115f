"""Run as a separate process: another Ray job that submits images to the
`ocr` app through serve_app.client and reports what it saw, as JSON."""

import json
import sys
import time
from pathlib import Path

import ray

from serve_app.client import OcrClient

address, *paths = sys.argv[1:]
ray.init(address=address, log_to_driver=False)
images = [Path(p).read_bytes() for p in paths]
client = OcrClient()
client.handle  # resolve the app before timing
t0 = time.perf_counter()
responses = [client.submit(img) for img in images]
submitted = time.perf_counter() - t0
first_done = None
results = [None] * len(images)
for i, r in enumerate(responses):
    results[i] = r.result(timeout_s=600)
    if first_done is None:
        first_done = time.perf_counter() - t0
mapped = {item.index: item.result["results"] for item in client.map(images[:8], max_in_flight=3)}
print(json.dumps({"submitted_s": submitted, "first_result_s": first_done,
                  "results": [r["results"] for r in results], "mapped": mapped}, ensure_ascii=False))
