"""The shared vocabulary of every room: errors (each with its HTTP status), the
engine's static config (engine_config) and the app's builder args (app_args),
per-request options (request_options), result carriers (results), the
request's context and its lanes. Imports nothing else of serve_app."""
