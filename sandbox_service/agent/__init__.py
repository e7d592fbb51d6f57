"""The in-sandbox agent: a small server (exec, files, pty) the control plane talks to.

The same program runs in both backends: on a Unix socket locally, on TCP (TLS) in a Kubernetes pod.
It is stdlib-only so that it can be injected into any image that has a Python 3 interpreter.
"""
