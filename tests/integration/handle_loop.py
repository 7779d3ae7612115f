"""Run as a separate process, inside a node's network namespace: another Ray
job (ray.init(address=the head's GCS), on the node at NODE_IP) that keeps reading one image through
the `ocr` app's handle (serve_app.client.OcrClient, the SPEC's handle API)
until the file STOP exists, one JSON line per answer in OUT:
{"t": wall clock at the answer, "ok": bool, "results" or "error"}. It never
stops on an error: it records it, backs off 0.5 s and goes on (the test
bounds the errors)."""

import json
import sys
import time
from pathlib import Path

import ray

from serve_app.client import OcrClient

address, node_ip, image, out, stop = sys.argv[1:]
# The node named, not the one Ray prefers: it takes every node on this host
# (one hostname for all the namespaces) for a local one and picks the head,
# whose address the driver then gives out while it listens in w1's namespace.
ray.init(address=address, _node_ip_address=node_ip, log_to_driver=False)
data = Path(image).read_bytes()
client = OcrClient()
with open(out, "a", buffering=1) as f:
    while not Path(stop).exists():
        try:
            body = client.submit(data).result(timeout_s=60)
            line = {"t": time.time(), "ok": True, "results": body["results"]}
        except Exception as e:  # recorded, never raised
            line = {"t": time.time(), "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            time.sleep(0.5)
        f.write(json.dumps(line, ensure_ascii=False) + "\n")
