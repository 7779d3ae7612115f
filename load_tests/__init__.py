"""Load tests of the OCR service: a small package.

Modules by role (none imports Ray at module level):

* ``stats``: one ``Record`` per request, the one percentile definition, summaries.
* ``procfs``: the one /proc reader (memory: RSS, shared, private; CPU seconds).
* ``harness.service`` (outside this package: the harness the tests share):
  start Ray, deploy a Serve config file the way ``serve deploy`` does, wait
  for readiness and replicas, stop; ``harness.peer``, ``harness.pdfs``,
  ``harness.pages``, ``harness.redis_server``: images, metrics, documents.
* ``images``: the peer images a run uses.
* ``loadgen``: request functions that never raise; closed, open and in-process loops.
* ``batches``: per-stage batch sizes sampled from the deployments' ``stats()``.
* ``baselines``: the in-process engine, RapidOCR and the simple server subprocess.
* ``engine_report``: bench_engine.py's accuracy, statistics and markdown.
* ``runs``: a run's points, and its raw JSON (to and from).
* ``analysis``, ``report``, ``plots``: the report, built only from the raw JSON.
* ``phases``: the benchmark's phases.
* ``bench``, ``soak``, ``bench_engine``: command lines
  (``python -m load_tests bench ...`` or ``python -m load_tests.bench ...``);
  ``cpu_by_process``, ``shape_memory``, ``locustfile``, ``simple_server``:
  small tools. Every program runs from the repository root as
  ``python -m load_tests NAME`` (``python -m load_tests`` lists them); none
  edits ``sys.path`` and none needs pytest.
"""
