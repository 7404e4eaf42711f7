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
import logging
import random
import time

import httpx

from ._errors import APIConnectionError, APIError, APITimeoutError, error_from_response

logger = logging.getLogger("docstream")

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


def failed_try(
    outcome: httpx.Response | httpx.TransportError, what: str, repeatable: bool
) -> tuple[APIError | APIConnectionError, float | None]:
    """The error of a try of ``what`` that did not succeed (an answer that is
    not a success, or none), and its ``Retry-After``; raised at once when the
    try must not be repeated."""
    if isinstance(outcome, httpx.Response):
        error = error_from_response(outcome)
        if not should_retry_status(outcome.status_code, repeatable):
            raise error
        return error, error.retry_after
    kind = APITimeoutError if isinstance(outcome, httpx.TimeoutException) else APIConnectionError
    lost = kind(f"{what}: no answer ({outcome!r})", cause=outcome)
    if not should_retry_exception(outcome, repeatable):
        raise lost from outcome
    return lost, None


def wait_before_retry(
    policy: RetryPolicy,
    what: str,
    tries: tuple[int, float],
    failure: tuple[APIError | APIConnectionError, float | None],
    idempotency_key: str | None = None,
) -> float:
    """How long to wait before trying ``what`` again, after ``tries`` (the
    count so far, and when the first started, by ``time.monotonic``) ended in
    ``failure`` (the error, and its ``Retry-After``). Raises the error, with a
    note of the tries, once the next one would start past the deadline."""
    (attempt, started), (error, retry_after) = tries, failure
    delay = policy.delay(attempt, retry_after)
    elapsed = time.monotonic() - started
    if elapsed + delay > policy.deadline:
        if policy.deadline > 0:
            error.add_note(
                f"gave up after {attempt} tries in {elapsed:.1f} s (retry deadline {policy.deadline:g} s)"
            )
            logger.warning("%s: giving up after %d tries: %s", what, attempt, error)
        raise error
    logger.info(
        "%s: try %d failed (%s); trying again in %.2f s",
        what, attempt, error, delay,
        extra={
            "docstream_error": error,
            "docstream_retry_after": retry_after,
            "docstream_delay": delay,
            "docstream_idempotency_key": idempotency_key,
        },
    )
    return delay
