"""The benchmark programs of the OCR service: `python -m load_tests` lists
them, `python -m load_tests NAME [MODE] ...` runs one (the registry:
load_tests/__main__.py; each mode a module built by load_tests/cli.py, with
a `--smoke` that tests/integration/test_load_tests.py runs).

Shared (none imports Ray at module level): ``loadgen`` (request functions
that never raise; closed, open, in-process and threaded loops), ``stats``
(``Record``, the one percentile, ``md_table``), ``images``; outside,
``harness.service`` (``served``, ``ServeRun``), ``harness.procfs`` (/proc,
the load-average line). ``batches``, ``baselines``, ``phases``, ``runs``,
``analysis``, ``report``, ``plots``, ``engine_report`` are parts of `serve
load` and `engine systems`; ``simple_server`` (the baseline server) and
``serve_floor_app`` (a model-free Serve app) are not programs of the list."""
