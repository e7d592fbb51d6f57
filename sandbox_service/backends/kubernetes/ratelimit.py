"""A client-side token bucket shared by every Kubernetes API call of one backend (client-go's QPS/burst).

The API server's Priority and Fairness answers an overload with 429s; a client that keeps within a
budget of its own gets fewer of them and does not turn a burst of creates into a retry storm.
Hand-written: twenty lines, and the rate-limit libraries on PyPI are asyncio- or Redis-bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """`qps` tokens a second, at most `burst` saved up; `acquire()` takes one, waiting if none is left."""

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if qps <= 0 or burst < 1:
            raise ValueError(f"TokenBucket needs qps > 0 and burst >= 1, got qps={qps}, burst={burst}")
        self.qps, self.burst = qps, burst
        self._clock, self._sleep = clock, sleep
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()
        self.waited_seconds = 0.0  # total time callers spent waiting for a token (a metric)

    def acquire(self) -> float:
        """Take a token; return how long the caller waited for it."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1  # reserve now (may go negative): waiters are served in arrival order
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
            self.waited_seconds += wait
        if wait > 0:
            self._sleep(wait)
        return wait
