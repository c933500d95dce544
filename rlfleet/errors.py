"""Which failures are worth retrying.

Transient: a server restarting (connection refused), a timeout, a child process that died and
can be relaunched. Deterministic: bad config, a shape mismatch, the same out-of-memory at the
same step twice — retrying those only repeats the failure N times, so they fail fast with the
cause. Unknown exceptions count as transient: a retry is cheap, a wrongly failed run is not.
"""

from __future__ import annotations

import httpx
from pydantic import ValidationError


class TransientError(RuntimeError):
    """Worth a retry: the next attempt may well succeed."""


class DeterministicError(RuntimeError):
    """Will fail the same way again: do not retry."""


DETERMINISTIC = (
    DeterministicError,
    ValidationError,
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    NotImplementedError,
    FileNotFoundError,
    PermissionError,
)
TRANSIENT = (TransientError, httpx.TransportError, TimeoutError, ConnectionError)


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, TRANSIENT):
        return True
    return not isinstance(exc, DETERMINISTIC)
