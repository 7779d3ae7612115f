"""Domain errors. Each carries the HTTP status it maps to; only the ingress
turns them into responses, so library and CLI users get ordinary exceptions."""

from __future__ import annotations


class OcrError(Exception):
    """Base class. `code` is a stable machine-readable string."""

    status: int = 500
    code: str = "internal"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BadImage(OcrError):
    status = 400
    code = "bad_image"


class BadRequest(OcrError):
    status = 400
    code = "bad_request"


class Unauthorized(OcrError):
    status = 401
    code = "unauthorized"


class Forbidden(OcrError):
    status = 403
    code = "forbidden"


class NotFound(OcrError):
    status = 404
    code = "not_found"


class RequestTimeout(OcrError):
    """The request body did not arrive within the body read deadline."""

    status = 408
    code = "request_timeout"


class IdempotencyConflict(OcrError):
    """An Idempotency-Key reused with a different image or options."""

    status = 422
    code = "idempotency_conflict"


class TooLarge(OcrError):
    status = 413
    code = "too_large"


class PageOverBudget(TooLarge):
    """One page of a document took more than its time (or memory) budget;
    the message names the page."""

    code = "page_over_budget"


class UnsupportedMediaType(OcrError):
    status = 415
    code = "unsupported_media_type"


class Retryable(OcrError):
    """A 503: the request was fine, the service could not take it now; the
    ingress sends `Retry-After: retry_after_s`."""

    status = 503

    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Overloaded(Retryable):
    code = "overloaded"


class ModelLoading(Overloaded):
    """The request's model set is being loaded (its first request, or after
    it was unloaded); retry after Retry-After. An Overloaded: a job that
    meets it waits and tries again (serve_app.jobs.book), as for a full
    service."""

    code = "model_loading"


class ModelUnavailable(Overloaded):
    """The request's model set failed to load (the reason is in the
    service's log); the default set still serves. A job retries it within
    jobs.overloaded_wait_s."""

    code = "model_unavailable"


class Unavailable(Retryable):
    """A replica serving this request died or restarted; retrying is safe."""

    code = "unavailable"


class DeadlineExceeded(OcrError):
    status = 504
    code = "deadline_exceeded"


class ModelError(OcrError):
    """A model file is missing, corrupt, or a predictor cannot be built."""

    status = 500
    code = "model_error"


class ConfigError(OcrError):
    """A configuration value is invalid; raised at construction, never later."""

    status = 500
    code = "config_error"
