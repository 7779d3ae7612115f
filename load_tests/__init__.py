"""The benchmark programs of the OCR service: `python -m load_tests` lists
them, `python -m load_tests NAME [MODE] ...` runs one (the registry:
load_tests/__main__.py; each mode a module with `add_cli_args(parser)` and
`main(args)`, built by load_tests/cli.py, and a `--smoke` that
tests/integration/test_load_tests.py runs).

Shared by them all (none imports Ray at module level):

* ``loadgen``: request functions that never raise; closed, open and in-process loops.
* ``stats``: one ``Record`` per request, the one percentile definition, summaries.
* ``images``: the images a run sends (the peer set: ``harness.peer.PEER``).
* ``harness.service`` (outside this package, shared with the tests): start
  Ray, deploy a Serve config, wait for /readyz (``wait_ready``) and replicas,
  stop; ``harness.procfs``: the one /proc reader; ``harness.hostile``: the
  costly requests; ``harness.pdfs``, ``harness.pages``, ``harness.redis_server``.
* ``batches``, ``baselines``, ``phases``, ``runs``, ``analysis``, ``report``,
  ``plots``, ``engine_report``: the parts of `serve load` and `engine systems`.
* ``simple_server`` (the baseline server, run as ``python -m
  load_tests.simple_server``) and ``serve_floor_app`` (a model-free Serve
  app): not programs of the list.
"""
