"""OpenVINO's own per-operator counters for one Paddle program, run by
`load_tests/tiers_ops.py` in an environment that has the `openvino` Python
package of the version Paddle Inference bundles (`make openvino-env`:
.venv-openvino). Stdlib, numpy and openvino only: it imports nothing from
serve_app.

    .venv-openvino/bin/python load_tests/openvino_counters.py PROGRAM.pdmodel PRECISION THREADS REPEAT N,C,H,W ...

For each input shape the program is compiled twice on the CPU, as Paddle
compiles it (the program's own input shape: dynamic) and reshaped to that
one shape (static), with PERF_COUNT on; the two are run interleaved
(`REPEAT` calls each after two warm-ups). Prints one JSON object: per
shape and mode, the median ms of a call and the counters' ms per
(operator type, kernel), and the ten slowest nodes.
"""

import collections
import json
import sys
import time


def profile(core, path, shape, precision, threads, repeat):
    import numpy as np
    import openvino as ov

    reqs = {}
    for mode in ("dynamic", "static"):
        model = core.read_model(path)
        if mode == "static":
            model.reshape({model.inputs[0].any_name: ov.PartialShape(shape)})
        compiled = core.compile_model(model, "CPU", {"PERF_COUNT": "YES", "INFERENCE_NUM_THREADS": str(threads),
                                                     "INFERENCE_PRECISION_HINT": precision})
        reqs[mode] = compiled.create_infer_request()
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    times = collections.defaultdict(list)
    for i in range(repeat + 2):
        for mode, req in reqs.items():
            t = time.perf_counter()
            req.infer({0: x})
            if i >= 2:
                times[mode].append((time.perf_counter() - t) * 1e3)
    out = {}
    for mode, req in reqs.items():
        by_type, count, nodes = collections.Counter(), collections.Counter(), []
        for p in req.profiling_info:  # the last call's counters
            ms = p.real_time.total_seconds() * 1e3
            key = f"{p.node_type} ({p.exec_type})"
            by_type[key] += ms
            count[key] += 1
            nodes.append((ms, p.node_name, key))
        nodes.sort(reverse=True)
        out[mode] = {"median_ms": sorted(times[mode])[len(times[mode]) // 2],
                     "types": {k: [round(v, 3), count[k]] for k, v in by_type.most_common()},
                     "slowest": [[round(ms, 3), name, key] for ms, name, key in nodes[:10]]}
    return out


def main(argv):
    import openvino as ov

    path, precision, threads, repeat = argv[0], argv[1], int(argv[2]), int(argv[3])
    shapes = [[int(v) for v in s.split(",")] for s in argv[4:]]
    core = ov.Core()
    result = {"openvino": ov.get_version(), "program": path, "precision": precision,
              "shapes": {"x".join(map(str, s)): profile(core, path, s, precision, threads, repeat) for s in shapes}}
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
