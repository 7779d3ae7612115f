"""Ray Serve: the thin deployments, what a replica does around its predictor,
the recogniser's crop scheduler and request router, admission by cost, the
result cache, autoscaling, the canary, live stats and metrics."""
