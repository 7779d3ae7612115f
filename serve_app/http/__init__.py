"""The HTTP edge: the FastAPI ingress (dependencies, error handlers,
middleware, the one read path), one module per API, reading a request
(body, headers, schemas), PaddleX's shapes and the web page."""
