"""Save x2paddle's generated model as a legacy Paddle program
(`inference.pdmodel` + `inference.pdiparams`), the format Paddle Inference
3.3.1 hands to its bundled OpenVINO engine (a Paddle 3 `inference.json` it
runs on oneDNN fp32 even under enable_openvino_engine).

    .venv-export/bin/python serve_app/tools/export_legacy.py CODE.py MODEL.pdparams OUT_DIR [HEIGHT]

Runs in the export-only environment (`make models` makes `.venv-export`:
paddlepaddle 2.6.2, whose `paddle.jit.save` writes the legacy program;
Paddle 3.3.1 with FLAGS_enable_pir_api=0 cannot trace x2paddle's code: its
`paddle.multiply` refuses a static Variable). Stdlib and paddle only: it
imports nothing from serve_app. CODE.py is the already rewritten code
(serve_app.tools.convert_models.rewrite_legacy). HEIGHT fixes the input's
height (a recogniser's 48) where the trace needs it; -1 leaves it free.
"""

import importlib.util
import os
import sys


def main(argv):
    code_path, params_path, out_dir = argv[:3]
    height = int(argv[3]) if len(argv) > 3 else -1
    import paddle

    spec = importlib.util.spec_from_file_location("x2paddle_legacy_export", code_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    paddle.disable_static()
    model = module.ONNXModel()
    model.set_dict(paddle.load(params_path), use_structured_name=True)
    model.eval()
    spec_in = [paddle.static.InputSpec(shape=[-1, 3, height, -1], dtype="float32", name="x")]
    os.makedirs(out_dir, exist_ok=True)
    paddle.jit.save(paddle.jit.to_static(model, input_spec=spec_in), os.path.join(out_dir, "inference"))
    for name in ("inference.pdmodel", "inference.pdiparams"):
        if not os.path.isfile(os.path.join(out_dir, name)):
            sys.exit(f"paddle.jit.save wrote no {name} in {out_dir}")
    print("paddle", paddle.__version__)


if __name__ == "__main__":
    main(sys.argv[1:])
