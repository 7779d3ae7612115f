"""The HTTP API as one APIRouter per API, each route a plain function whose
needs are its parameters (the front, the request id, the token check:
deps.py): v1.py (/v1/ocr, /v1/ocr/batch), jobs.py (/v1/ocr/jobs),
paddlex.py (PaddleX's /ocr), page.py (the web page, the probes,
/v1/stats). serve_app/http/app.py puts them on one app."""
