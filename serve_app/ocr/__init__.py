"""Pure OCR steps on one image, numpy/OpenCV (no Ray, no Paddle): decode and
its header checks, detector pre/post-processing, crops, direction,
recognition (resize, CTC), tiling, reading order, layout, orientation,
words, the picture of a result."""
