"""load_tests/serve_phases.py reads each phase's end from `serve run`'s own
output (no Ray here: a captured log)."""

from __future__ import annotations

from datetime import datetime

from load_tests.serve_phases import phases, table

LOG = """\
2026-12-02 09:31:33,860\tINFO scripts.py:489 -- Running config file: 'deployments.light.yaml'.
2026-12-02 09:31:36,773\tINFO worker.py:2029 -- Started a local Ray instance. View the dashboard at http://127.0.0.1:8265
INFO 2026-12-02 09:31:38,243 serve 24518 -- Started Serve in namespace "serve".
(ServeController pid=24988) INFO 2026-12-02 09:31:39,317 controller 24988 -- Imported and built app 'ocr' successfully.
(ServeController pid=24988) INFO 2026-12-02 09:31:39,479 controller 24988 -- Adding 1 replica to Deployment(name='TextRecognizer', app='ocr').
(ServeController pid=24988) INFO 2026-12-02 09:31:39,486 controller 24988 -- Adding 2 replicas to Deployment(name='JobStore', app='ocr').
(ServeReplica:ocr:TextRecognizer pid=1) INFO 2026-12-02 09:31:46,128 ocr_TextRecognizer m6 -- cls replica ready: load 0.25s, warm-up 0.12s over 6 shapes
(ServeReplica:ocr:TextRecognizer pid=1) INFO 2026-12-02 09:31:47,271 ocr_TextRecognizer m6 -- det replica ready: load 0.33s, warm-up 3.63s over 21 shapes
(ServeReplica:ocr:TextRecognizer pid=1) INFO 2026-12-02 09:31:46,900 ocr_TextRecognizer m6 -- rec replica ready: load 0.48s, warm-up 1.42s over 15 shapes
"""


def test_each_phase_ends_at_its_first_line_and_the_models_at_their_last_ready():
    t0 = datetime(2026, 12, 2, 9, 31, 31, 800000).timestamp()
    got = phases(LOG, t0, 16.1)
    want = {"CLI start": 2.06, "Ray up": 4.973, "Serve up": 6.443, "app built": 7.517, "replicas added": 7.679,
            "model replicas ready": 15.471, "/readyz 200": 16.1}
    assert got.keys() == want.keys()
    assert all(abs(got[k] - v) < 1e-3 for k, v in want.items()), got


def test_a_phase_missing_from_the_log_is_shown_as_a_dash():
    got = phases("2026-12-02 09:31:33,860\tINFO -- Running config file: 'x'.\n",
                 datetime(2026, 12, 2, 9, 31, 33).timestamp(), 7.0)
    assert got["Ray up"] is None and got["model replicas ready"] is None
    rows = table({"floor": [got]}).splitlines()
    assert rows[0] == "| s from `serve run` | floor, start 1 |"
    assert "| Ray up | - |" in rows and "| /readyz 200 | 7.0 |" in rows and "| CLI start | 0.9 |" in rows
