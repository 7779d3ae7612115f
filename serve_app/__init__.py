"""OCR on Ray Serve with Paddle Inference (PP-OCRv4).

The package is in rooms by role. LAYERS is their order, bottom to top: a
module imports only from its own room or a room below it
(tests/unit/test_layers.py checks it). Above every room: the top-level
modules (app: the Serve app builder; engine: the in-process OcrEngine and
the CLI's; client: OcrClient; __main__: the CLI) and tools/."""

LAYERS = ("core", "ocr", "structure", "inference", "flow", "serving", "jobs", "http", "integrations")
