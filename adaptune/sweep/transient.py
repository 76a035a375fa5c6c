"""The transient-error rule: which failures of a run are worth another attempt (out of memory on a shared
device, network, storage). How often and after how long a wait: adaptune.sweep.retry."""

from __future__ import annotations

import errno

# Exception class names (anywhere in the MRO or the cause chain) that mean "try again later": the
# requests/urllib3/http.client family, aiohttp (gcsfs), httpx (huggingface_hub), google-api-core.
TRANSIENT_NAMES = frozenset({
    "ConnectionError", "TimeoutError", "Timeout", "ReadTimeout", "ConnectTimeout", "ChunkedEncodingError",
    "RemoteDisconnected", "IncompleteRead", "ProtocolError", "ServerDisconnectedError", "ClientConnectionError",
    "ClientPayloadError", "ServerTimeoutError", "TransportError", "NetworkError", "RemoteProtocolError",
    "ReadError", "WriteError", "PoolTimeout", "ServiceUnavailable", "TooManyRequests", "InternalServerError",
    "GatewayTimeout", "BadGateway", "DeadlineExceeded", "RetryError", "OutOfMemoryError",
})
# OS errors of a storage mount (Cloud Storage FUSE answers EIO for a failed GCS call, ESTALE when a
# concurrent writer replaced the object) and of the network.
TRANSIENT_ERRNOS = frozenset({errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED,
                              errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EAGAIN})
TRANSIENT_HTTP_CODES = frozenset({408, 429, 500, 502, 503, 504})  # gcsfs HttpError.code, hub responses


def is_transient(error: BaseException) -> bool:
    """Out of memory, network and storage errors, here or in the exception's causes."""
    from adaptune.core.devices import is_out_of_memory

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if is_out_of_memory(current) or any(cls.__name__ in TRANSIENT_NAMES for cls in type(current).__mro__):
            return True
        if isinstance(current, OSError) and current.errno in TRANSIENT_ERRNOS:
            return True
        if _http_status(current) in TRANSIENT_HTTP_CODES:
            return True
        current = current.__cause__ or current.__context__
    return False


def _http_status(error: BaseException) -> int | None:
    code = getattr(error, "code", None)
    if not isinstance(code, int):
        response = getattr(error, "response", None)
        code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None
