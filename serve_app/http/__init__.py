"""The HTTP edge: the front (front.py: the lease, the one read path, the
handle API's logic; no Ray), the FastAPI app built over it (app.py: error
handlers, middleware) from one router per API (routes/), reading a request
(body, headers, schemas), PaddleX's shapes, the web page, and the Serve
deployment that holds a front (ingress.py, the one module here that
imports Ray)."""
