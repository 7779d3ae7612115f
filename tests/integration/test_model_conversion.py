"""The check every converted PP-OCRv6 model passes before it is used
(serve_app/tools/conversion_check.py), run for real on the conversion `make
install` made: Paddle (the service's CPU config, fp32) against onnxruntime on the
original ONNX file, on fixed inputs and on 60 crops of the peer images. The
untouched conversion passes (and runs on OpenVINO); the same files with a few weights altered are
refused with an error naming the parameter file. PP-OCRv6 tiny's recogniser
(4 MB, seconds) stands for the four."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from serve_app.inference import weights
from serve_app.tools.conversion_check import PARAMS, ConversionError, load_charset, verify
from serve_app.tools.convert_models import SOURCE
from serve_app.tools.legacy_rewrite import rewrite_legacy


@pytest.fixture(scope="module")
def tiny_rec(tmp_path_factory):
    """A copy of the cached conversion (never the cache itself): model, source, dictionary."""
    entry = weights.converted_dir("ppocrv6_tiny", "rec")  # "run `make models`" when install has not converted it
    d = tmp_path_factory.mktemp("tiny_rec")
    for f in entry.iterdir():
        shutil.copy(f, d / f.name)
    return d, load_charset(weights.dictionary_path(model="ppocrv6_tiny"))


def test_the_cached_conversion_reads_the_peer_crops_as_onnxruntime_does(tiny_rec):
    d, charset = tiny_rec
    report = verify("rec", d, d / SOURCE, charset)
    assert report["crops"] == 60 and report["strings_differ"] == 0
    assert report["fixed_max_abs_diff"] < 1e-3 and report["real_max_abs_diff"] < 1e-3


def test_altered_weights_are_refused_naming_the_parameter_file(tiny_rec, tmp_path):
    d, charset = tiny_rec
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    params = bad / PARAMS
    data = bytearray(params.read_bytes())
    # Float32 weights from the second half of the file (the recogniser's head
    # and the layers before it) scaled by 1.5: same size, plausible numbers.
    start = (len(data) // 2) & ~3
    w = np.frombuffer(bytes(data[start:start + 400_000]), dtype=np.float32).copy()
    data[start:start + 400_000] = (w * 1.5).astype(np.float32).tobytes()
    params.write_bytes(bytes(data))
    with pytest.raises(ConversionError, match=str(params)):
        verify("rec", bad, bad / SOURCE, charset)


def test_the_service_predictor_runs_the_cached_conversion_on_openvino(tiny_rec, tmp_path):
    """Paddle 3.3.1 hands only a legacy program to OpenVINO (a Paddle 3 .json
    runs on oneDNN, writing nothing): OpenVINO's compiled model in the
    predictor's cache folder is the proof that it ran there."""
    from serve_app.core.engine_config import PredictorOptions
    from serve_app.inference.predictor import PaddlePredictor

    files = weights.model_files("rec", model="ppocrv6_tiny")
    assert files.program.name == "inference.pdmodel"
    p = PaddlePredictor(files, PredictorOptions(enable_openvino_engine=True, cpu_math_library_num_threads=1,
                                                cache_dir=str(tmp_path)), "v6-tiny-rec")
    try:
        out = p.run(np.zeros((1, 3, 48, 320), np.float32))
    finally:
        p.close()
    assert out.shape[0] == 1 and np.allclose(out.sum(-1), 1, atol=1e-2)  # per-step character probabilities
    assert list(tmp_path.rglob("*.blob")), "no OpenVINO compiled model: the predictor did not run on OpenVINO"


# The PP-OCRv6 detectors' DB head as x2paddle writes it: a transposed convolution to the 16-channel map, then
# the last one to the one-channel map, its bias (a parameter read into a local) and the sigmoid.
X2PADDLE_DB_HEAD = """\
import paddle
from x2paddle.op_mapper.onnx2paddle import onnx_custom_layer as x2paddle_nn

class ONNXModel(paddle.nn.Layer):
    def __init__(self):
        super(ONNXModel, self).__init__()
        self.x2paddle_p2o_pd_op_reshape_76_0 = self.create_parameter(shape=[1, 1, 1, 1], attr='x2paddle_p2o_pd_op_reshape_76_0', dtype='float32', default_initializer=paddle.nn.initializer.Constant(value=-0.3))
        self.conv_trans0 = paddle.nn.Conv2DTranspose(in_channels=8, out_channels=16, kernel_size=[2, 2], stride=2, bias_attr=False)
        self.relu19 = paddle.nn.ReLU()
        self.conv_trans1 = paddle.nn.Conv2DTranspose(in_channels=16, out_channels=1, kernel_size=[2, 2], stride=2, bias_attr=False)
        self.sigmoid0 = paddle.nn.Sigmoid()

    def forward(self, x2paddle_x):
        x2paddle_p2o_pd_op_reshape_76_0 = self.x2paddle_p2o_pd_op_reshape_76_0
        x2paddle_ConvTranspose_1 = self.conv_trans0(x2paddle_x)
        x2paddle_p2o_pd_op_relu_19_0 = self.relu19(x2paddle_ConvTranspose_1)
        x2paddle_ConvTranspose_3 = self.conv_trans1(x2paddle_p2o_pd_op_relu_19_0)
        x2paddle_Add_221 = paddle.add(x=x2paddle_ConvTranspose_3, y=x2paddle_p2o_pd_op_reshape_76_0)
        x2paddle_fetch_name_0 = self.sigmoid0(x2paddle_Add_221)
        return x2paddle_fetch_name_0
"""


def _model(code: str, name: str):
    namespace: dict = {}
    code = re.sub(r"attr='\w+', ", "", code)  # dygraph refuses a parameter name twice in one process
    exec(compile(code, name, "exec"), namespace)  # noqa: S102 (test fixtures written above)
    return namespace["ONNXModel"]()


def test_the_legacy_rewrite_makes_the_db_heads_last_layer_a_convolution_with_the_same_map():
    import paddle

    code, counts = rewrite_legacy(X2PADDLE_DB_HEAD)
    assert counts["last_deconv_to_conv_shuffle"] == 1
    assert "self.conv_trans1(" not in code and "self.conv_trans0(" in code  # only the last one changes
    assert code.rstrip().endswith("return x2paddle_fetch_name_0")
    paddle.disable_static()
    paddle.seed(0)
    before = _model(X2PADDLE_DB_HEAD.replace("from x2paddle", "# from x2paddle"), "before")
    after = _model(code, "after")
    after.set_state_dict(before.state_dict())  # the same weights: the rewrite adds none
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((2, 8, 5, 7)).astype(np.float32))
    want, got = before(x).numpy(), after(x).numpy()
    assert want.shape == got.shape == (2, 1, 20, 28)
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_the_legacy_rewrite_leaves_a_head_it_does_not_know():
    # A transposed convolution of stride 1 is not a pixel layout: left as x2paddle wrote it.
    code = X2PADDLE_DB_HEAD.replace("kernel_size=[2, 2], stride=2, bias_attr=False)\n        self.sigmoid0",
                                    "kernel_size=[2, 2], stride=1, bias_attr=False)\n        self.sigmoid0")
    rewritten, counts = rewrite_legacy(code)
    assert counts["last_deconv_to_conv_shuffle"] == 0 and "self.conv_trans1(x2paddle_p2o_pd_op_relu_19_0)" in rewritten
