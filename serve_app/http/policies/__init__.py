"""The ingress's own policies, run only in the front (serve_app/http/front.py):
admission by cost and its cost model, the result cache and in-flight
sharing, the live figures. No Ray."""
