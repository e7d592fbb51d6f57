"""Tools around the service, not in its request path: the benchmark, the demo, leak checks, CPU accounting
for profiles."""
