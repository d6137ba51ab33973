"""Which store methods are requests to a Qdrant server, and which of their errors pass on their own.

A method marked ``@retried()`` (``@retried(write=True)`` for a write) is one request: ``ServerStore`` wraps each
method its classes mark (``retried_methods``) in its retry, so a method renamed or added keeps the retry with its
mark. ``transient`` says which errors are worth a retry; ``refused`` lists what a server store's call raises when the
server cannot be reached or refuses (``doctor`` reports those in one line).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from indexer.errors import StoreUnavailable

F = TypeVar("F", bound=Callable[..., Any])
_RETRIED = "_store_retried"  # the attribute ``retried`` sets on a method: whether it writes


def retried(write: bool = False) -> Callable[[F], F]:
    """Mark a store method as one request to a server that may fail for a while: ``ServerStore`` wraps every method
    so marked in its retry (``ServerStore._retrying``; ``write``: a write, whose failures set ``degraded``)."""

    def mark(fn: F) -> F:
        setattr(fn, _RETRIED, write)
        return fn

    return mark


def retried_methods(cls: type) -> dict[str, bool]:
    """Name -> ``write`` of every method of ``cls`` marked ``retried`` (by ``cls`` or a class it derives from; an
    override keeps its base's mark)."""
    out: dict[str, bool] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            write = getattr(value, _RETRIED, None)
            if write is not None:
                out[name] = write
    return out


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` may pass on its own: no connection, a timeout, HTTP 5xx/429, or the gRPC equivalents."""
    import grpc
    import httpx
    from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

    if isinstance(exc, (ResponseHandlingException, httpx.TransportError, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, UnexpectedResponse):
        return exc.status_code is not None and (exc.status_code >= 500 or exc.status_code == 429)
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL,
                              grpc.StatusCode.UNKNOWN, grpc.StatusCode.ABORTED, grpc.StatusCode.RESOURCE_EXHAUSTED)
    return False


def refused() -> tuple[type[BaseException], ...]:
    """What a ``ServerStore`` call raises when the server cannot be reached or refuses a request (a transient error
    retried to the end is ``StoreUnavailable``; HTTP 401/403 and the like come as qdrant-client's own, REST or gRPC)."""
    import grpc
    import httpx
    from qdrant_client.http.exceptions import ApiException

    return StoreUnavailable, ApiException, httpx.HTTPError, grpc.RpcError, OSError
