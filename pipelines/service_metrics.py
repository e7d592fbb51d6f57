"""Sandbox exec latency for the results table, read from the service's own Prometheus histogram."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def _quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus-style histogram_quantile: linear interpolation inside the bucket holding q."""
    total = buckets[-1][1]
    if total <= 0:
        return float("nan")
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            span = count - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / span if span else 0.0)
        prev_le, prev_count = le, count
    return prev_le


def histogram_summary(metrics_text: str, name: str) -> dict[str, float]:
    """n, mean, p50 and p95 of a histogram summed over its labels."""
    buckets: dict[float, float] = {}
    total_sum = total_count = 0.0
    for family in text_string_to_metric_families(metrics_text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
            elif sample.name == f"{name}_sum":
                total_sum += sample.value
            elif sample.name == f"{name}_count":
                total_count += sample.value
    if not total_count:
        return {}
    ordered = sorted(buckets.items())
    return {
        "n": total_count,
        "mean": total_sum / total_count,
        "p50": _quantile(ordered, 0.5),
        "p95": _quantile(ordered, 0.95),
    }


def exec_latency(url: str, token: str | None, timeout: float = 10.0) -> dict[str, float]:
    """Exec latency (seconds) the sandbox service measured over its lifetime; {} if unavailable."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(url.rstrip("/") + "/metrics", headers=headers, timeout=timeout)
        response.raise_for_status()
    except httpx.HTTPError:
        return {}
    return histogram_summary(response.text, "orchard_exec_seconds")
