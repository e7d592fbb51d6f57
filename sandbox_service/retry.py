"""One retry schedule for every HTTP client of the project: the sandbox client (sync and async) and
the OpenAI-compatible policy and judge clients (`components.core.policy.policies`); the local backend's
kill rounds (`backends/local/cgroups.py`) wait by it too.

Exponential backoff with jitter (0.5-1.5x, so clients retrying together do not stampede), capped;
a server's Retry-After (seconds) is honoured and never undercut up to the same cap; a longer one is waited out
only to the cap (an hour's Retry-After from a misconfigured proxy would otherwise stall a run for an hour), and
the retry count bounds how often that happens.
Hand-written rather than tenacity/backoff: it is a pure function of (attempt, Retry-After) that the
sync and async loops both call, and those libraries would wrap the loops instead.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


def parse_retry_after(value: str | float | None) -> float | None:
    """Seconds from a Retry-After header (an HTTP date is not honoured: None)."""
    if value is None or value == "":
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


@dataclass(frozen=True)
class Backoff:
    first: float = 0.05  # seconds before the first retry
    cap: float = 2.0  # longest single wait (Retry-After included)

    def delay(self, attempt: int, retry_after: str | float | None = None) -> float:
        """How long to wait before retry number `attempt + 1` (attempt counts from 0)."""
        asked = parse_retry_after(retry_after)
        if asked is not None:
            return min(asked * (1.0 + 0.5 * random.random()), self.cap)
        return min(self.first * 2**attempt, self.cap) * (0.5 + random.random())
