"""The errors of the esf API: one class per stable error code, all under Error.

Switch on the class (or on ``code``), never on the HTTP status: several codes
share one (conflict and stale_generation are both 409).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Type


class Error(Exception):
    """An error of an esf call.

    ``code`` is the API's stable code (``not_found``, ...), ``message`` the
    daemon's message, ``trace_id`` the W3C trace id of the call (the daemon's
    logs and events carry it), ``status`` the HTTP status (0 when the daemon
    was never reached).
    """

    code: str = "internal"

    def __init__(self, message: str, *, code: Optional[str] = None, trace_id: str = "",
                 status: int = 0) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.trace_id = trace_id
        self.status = status

    def __str__(self) -> str:
        s = f"{self.code}: {self.message}"
        if self.trace_id:
            s += f" (trace {self.trace_id})"
        return s


class InvalidArgument(Error):
    """A malformed request, id, path or body."""
    code = "invalid_argument"


class Unauthenticated(Error):
    """The network API refused the bearer token (or there was none)."""
    code = "unauthenticated"


class NotFound(Error):
    """An unknown id or endpoint."""
    code = "not_found"


class Conflict(Error):
    """The operation conflicts with the current state. A merge conflict lists
    every conflicting path in ``paths`` ("" is the root)."""
    code = "conflict"

    def __init__(self, message: str, *, code: Optional[str] = None, trace_id: str = "",
                 status: int = 0, paths: Optional[List[str]] = None) -> None:
        super().__init__(message, code=code, trace_id=trace_id, status=status)
        self.paths: List[str] = list(paths or [])


class StaleGeneration(Error):
    """An expected generation, lease token or root is out of date."""
    code = "stale_generation"


class FailedPrecondition(Error):
    """The current state does not allow the operation."""
    code = "failed_precondition"


class QuotaExceeded(Error):
    """A quota or limit was hit."""
    code = "quota_exceeded"


class Internal(Error):
    """A bug or an unexpected system error in the daemon."""
    code = "internal"


class Corrupt(Error):
    """Stored content does not match its id."""
    code = "corrupt"


class Unsupported(Error):
    """Not supported by this daemon."""
    code = "unsupported"


class Unavailable(Error):
    """The daemon (or one of its dependencies) cannot be reached."""
    code = "unavailable"


class DeadlineExceeded(Error):
    """The call's deadline passed, or the command was cancelled or timed out."""
    code = "deadline_exceeded"


_ALL: Tuple[Type[Error], ...] = (
    InvalidArgument, Unauthenticated, NotFound, Conflict, StaleGeneration, FailedPrecondition,
    QuotaExceeded, Internal, Corrupt, Unsupported, Unavailable, DeadlineExceeded)

CLASSES: Dict[str, Type[Error]] = {c.code: c for c in _ALL}

# What a response without a code in its body means (a proxy, a crash before
# the handler wrote): the most general code of its status.
_STATUS_CODES: Dict[int, str] = {
    400: "invalid_argument", 401: "unauthenticated", 404: "not_found", 405: "invalid_argument",
    409: "conflict", 412: "failed_precondition", 413: "invalid_argument",
    415: "invalid_argument", 429: "quota_exceeded", 501: "unsupported", 502: "unavailable",
    503: "unavailable", 504: "deadline_exceeded",
}


def code_for_status(status: int) -> str:
    return _STATUS_CODES.get(status, "internal")


def make_error(code: str, message: str, *, trace_id: str = "", status: int = 0,
               paths: Optional[List[str]] = None) -> Error:
    """The exception of a code; an unknown code is an Error carrying it."""
    cls = CLASSES.get(code)
    if cls is Conflict:
        return Conflict(message, trace_id=trace_id, status=status, paths=paths)
    if cls is None:
        return Error(message, code=code, trace_id=trace_id, status=status)
    return cls(message, trace_id=trace_id, status=status)
