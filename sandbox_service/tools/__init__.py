"""Tools around the service, not in its request path: the benchmark, the demo, leak checks, leftover cleanup,
CPU accounting for profiles."""
