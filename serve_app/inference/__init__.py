"""The Paddle Inference seam: predictors (the only place that imports paddle),
the model weights, compiled-engine caches, TensorRT shape ranges and
libraries, the fp16 check, and the stage runners (pre, one predictor call,
post)."""
