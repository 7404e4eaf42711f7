"""When and how long to wait before repeating a request.

The server's contract (``docs/src/api.md``, *When 202 is sent*): a request
that got ``503`` or no answer is repeated with the same ``Idempotency-Key``,
after at least ``Retry-After`` and with a growing backoff; the key makes the
repeat find the first job instead of creating a second one.

What is repeated:

* a request that surely was not acted on: the connection could not be opened,
  or the server answered ``503`` or ``429`` (both come with ``Retry-After``);
* a request that may have been acted on (the answer was lost, or a proxy
  answered ``502``/``504``) only when repeating it is harmless: ``GET``,
  ``DELETE``, and ``POST``\\ s that carry an ``Idempotency-Key`` (submits,
  bulk actions) or are content-addressed (file uploads).

Nothing is repeated once the policy's ``deadline`` (seconds since the first
try) would pass: the last error is raised, with a note saying how many tries
were made.
"""

from __future__ import annotations

import dataclasses
import random

import httpx

__all__ = ["RetryPolicy"]


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How a client repeats requests.

    Args:
        deadline: No try starts later than this many seconds after the first.
            ``0`` disables retries.
        initial_backoff: The wait before the second try, in seconds.
        max_backoff: The longest wait between two tries (``Retry-After`` may ask for more).
        multiplier: Each wait is this many times the one before.
        jitter: Each backoff is shortened by up to this fraction at random, so
            that clients refused together do not come back together.
    """

    deadline: float = 60.0
    initial_backoff: float = 0.25
    max_backoff: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def backoff(self, attempt: int) -> float:
        """The backoff after the ``attempt``-th failed try (from 1), before ``Retry-After``."""
        base = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        return base * (1.0 - self.jitter * random.random())

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """How long to wait after the ``attempt``-th failed try: at least ``Retry-After``."""
        wait = self.backoff(attempt)
        if retry_after is not None:
            wait = max(wait, retry_after)
        return wait


NO_RETRY = RetryPolicy(deadline=0.0)

# Statuses after which the request surely did nothing.
SAFE_STATUSES = frozenset({429, 503})
# Statuses (from a proxy) after which the request may have done something.
UNSURE_STATUSES = frozenset({502, 504})


def request_not_sent(exc: httpx.TransportError) -> bool:
    """The request never reached the server (so repeating it is always safe)."""
    return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))


def should_retry_status(status: int, repeatable: bool) -> bool:
    """Whether an answer with this status is worth another try."""
    return status in SAFE_STATUSES or (repeatable and status in UNSURE_STATUSES)


def should_retry_exception(exc: httpx.TransportError, repeatable: bool) -> bool:
    """Whether a request that failed with ``exc`` (no answer) is worth another try."""
    return request_not_sent(exc) or repeatable
