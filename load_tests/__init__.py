"""The benchmark programs of the OCR service: `python -m load_tests` lists
them, `python -m load_tests NAME [MODE] ...` runs one (the registry:
load_tests/__main__.py; each mode a module built by load_tests/cli.py, with
a `--smoke` that tests/integration/test_load_tests.py runs).

Shared by them all (none imports Ray at module level): ``loadgen`` (request
functions that never raise; closed, open and in-process loops), ``stats``
(one ``Record`` per request, the one percentile definition), ``images``
(the peer set); outside the package, ``harness.service`` (``served``:
start, deploy, wait, stop), ``harness.procfs`` (the /proc reader, the
load-average line), ``harness.hostile``, ``harness.pdfs``, ``harness.pages``.
``batches``, ``baselines``, ``phases``, ``runs``, ``analysis``, ``report``,
``plots``, ``engine_report`` are the parts of `serve load` and `engine
systems`; ``simple_server`` (the baseline server) and ``serve_floor_app``
(a model-free Serve app) are not programs of the list.
"""
