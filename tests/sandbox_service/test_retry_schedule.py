"""The one retry schedule shared by the sandbox client and the OpenAI-compatible clients."""

from __future__ import annotations

from components.core.policy.policies import OpenAICompatiblePolicy, OpenAIPolicyConfig
from sandbox_service import client as sandbox_client
from sandbox_service.retry import Backoff, parse_retry_after


def test_backoff_grows_is_capped_and_jittered():
    b = Backoff(first=0.1, cap=1.0)
    for attempt, base in ((0, 0.1), (1, 0.2), (2, 0.4), (5, 1.0)):
        delays = [b.delay(attempt) for _ in range(200)]
        assert base * 0.5 <= min(delays) and max(delays) <= base * 1.5
        assert len(set(delays)) > 1, "jitter"


def test_retry_after_is_honoured_never_undercut_and_capped():
    b = Backoff(first=0.1, cap=1.0)
    assert all(0.5 <= b.delay(0, "0.5") <= 0.75 for _ in range(100))
    assert b.delay(0, "30") == 1.0  # the server asked for longer than our cap: wait the cap, not 30 s
    assert Backoff(0.5, 20).delay(0, "3600") == 20.0  # not an hour
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None  # an HTTP date falls back to backoff
    assert 0.05 <= b.delay(0, "Wed, 21 Oct 2015 07:28:00 GMT") <= 0.15


def test_both_clients_use_the_shared_schedule(monkeypatch):
    calls = []
    monkeypatch.setattr(
        Backoff,
        "delay",
        lambda self, attempt, retry_after=None: calls.append((self.first, self.cap, attempt, retry_after)) or 0.0,
    )
    policy = OpenAICompatiblePolicy(
        OpenAIPolicyConfig(base_url="http://127.0.0.1:9/v1", model="m", backoff_seconds=0.3, max_backoff_seconds=4)
    )
    policy.endpoint.backoff.delay(2, "1")  # the endpoint client retries on this Backoff
    assert calls == [(0.3, 4, 2, "1")]
    # the sandbox client's schedule is a bound Backoff.delay (bound before the patch, so check its owner)
    assert isinstance(sandbox_client._backoff.__self__, Backoff)
