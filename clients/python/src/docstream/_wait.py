"""When :meth:`Client.wait` stops polling."""

from __future__ import annotations

from ._models import TERMINAL_STATUSES, Extraction

MAX_POLL_INTERVAL = 2.0


def is_done(job: Extraction, boxes: bool) -> bool:
    """The job is finished (and, with ``boxes``, so is its bbox refinement if it succeeded)."""
    if job.status not in TERMINAL_STATUSES:
        return False
    if not boxes or job.status != "succeeded":
        return True
    refinement = job.post_processing.bbox_refinement
    return refinement is None or refinement.status in ("succeeded", "failed")


def next_poll(interval: float) -> float:
    """The next poll interval: 1.5 times longer, up to 2 s."""
    return min(MAX_POLL_INTERVAL, interval * 1.5)
