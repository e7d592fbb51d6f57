"""The in-sandbox agent: a small server (exec, files, pty) the control plane talks to.

The same program runs in both backends: on a Unix socket locally, on TCP (TLS) in a Kubernetes pod.
It is stdlib-only so that it can be injected into any image that has a Python 3 interpreter. The
control plane's side of the protocol (pydantic models, TLS material, backends) lives outside this
package: `sandbox_service/agent_link/` (`client.py`, `base.py`, `tls.py`).
"""
