"""The check every converted PP-OCRv6 model passes before it is used
(serve_app/tools/conversion_check.py), run for real on the conversion `make
install` made: Paddle (the service's CPU config, fp32) against onnxruntime on the
original ONNX file, on fixed inputs and on 60 crops of the peer images. The
untouched conversion passes (and runs on OpenVINO); the same files with a few weights altered are
refused with an error naming the parameter file. PP-OCRv6 tiny's recogniser
(4 MB, seconds) stands for the four."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from serve_app.inference import weights
from serve_app.tools.conversion_check import PARAMS, ConversionError, load_charset, verify
from serve_app.tools.convert_models import SOURCE


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
