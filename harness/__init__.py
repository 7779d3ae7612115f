"""The test and benchmark harness, one importable package shared by tests/
and load_tests/ (run both from the repository root; pytest puts the root on
sys.path through pyproject's `pythonpath`, `python -m load_tests ...` through
the working directory). Nothing here imports pytest.

- `service`: the one way to start the service (a local Ray cluster of our
  own, Serve on a port, a Serve config file deployed as `serve deploy` does,
  readiness and replica waits, stop) and `SharedServices`, which lets test
  modules whose configs are equal share one started service.
- `peer`: the peer images (tests/data/peer), their reference reads and the
  agreement / CER metrics.
- `pdfs`, `pages`: the PDF and page makers (documents, hostile PDFs, layouts).
- `redis_server`: a real redis-server in a temporary folder.
- `netns_cluster`: a Ray cluster whose nodes have their own addresses (one
  network namespace each, on a bridge; needs root and iproute2).
- `xml_checks`, `readme_blocks`: ALTO/hOCR checks; the README's commands.
- `front`: a Front (serve_app/http/front.py) over stand-in pipeline and job-store
  handles, for the route tests.
"""
