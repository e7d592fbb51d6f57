"""TLS material for Kubernetes sandbox agents: a fresh CA per sandbox, whose key is thrown away once it
signed that sandbox's one server certificate (built with `sandbox_service.agent_link.tls`).

Why per sandbox: the pod IP is unknown when the certificate is made (the Secret must exist before the
pod starts), so the certificate names the fixed `AGENT_TLS_SERVER_NAME` that the agent client checks,
not the address it connects to. With one CA for all sandboxes, any sandbox's certificate would then
pass for any other's. Trusting only the sandbox's own CA (the endpoint's `ca_cert_pem`) closes that:
no other sandbox, and nothing else on the network, holds a certificate that CA signed. The agent, in
turn, authenticates the service by the per-sandbox shared secret.
"""

from __future__ import annotations

from sandbox_service.agent_link.tls import make_ca, make_server_cert


class AgentCertificates:
    """Issues (ca_cert_pem, cert_pem, key_pem) for one sandbox."""

    def __init__(self, validity_days: float = 2):
        self.validity_days = validity_days  # the backend passes its capped pod lifetime plus an hour

    def issue(self, name: str) -> tuple[str, str, str]:
        ca = make_ca(f"orchard sandbox CA {name}"[:64], days=self.validity_days)
        cert_pem, key_pem = make_server_cert(ca, names=[name], days=self.validity_days)
        return ca.cert_pem.decode(), cert_pem.decode(), key_pem.decode()
