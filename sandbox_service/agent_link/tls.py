"""TLS material for agents reached over a network (Kubernetes): a CA and server certificates.

    ca = make_ca()                                     # once per service (or per sandbox)
    cert_pem, key_pem = make_server_cert(ca)           # mount into the pod, pass --tls-cert/--tls-key
    AgentEndpoint(transport="tcp", address=f"{pod_ip}:7777", secret=..., tls=True,
                  ca_cert_pem=ca.cert_pem.decode())

Pod IPs are unknown when a certificate is made, so server certificates name `AGENT_TLS_SERVER_NAME`
and `AgentClient` verifies the chain against the CA and that name (not the IP). Runs on the control
plane only (uses the `cryptography` package); the agent itself just loads the PEM files with `ssl`.
"""

from __future__ import annotations

import datetime as dt
import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pydantic import BaseModel, ConfigDict, Field

from sandbox_service.agent_link.client import AGENT_TLS_SERVER_NAME


class CertificateAuthority(BaseModel):
    """A CA key pair in PEM form."""

    model_config = ConfigDict(extra="forbid")
    cert_pem: bytes = Field(description="CA certificate (give to AgentEndpoint.ca_cert_pem, decoded).")
    key_pem: bytes = Field(description="CA private key (keep on the control plane).")


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(common_name: str = "orchard sandbox agents CA", days: float = 365) -> CertificateAuthority:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def make_server_cert(
    ca: CertificateAuthority, names: list[str] | None = None, ips: list[str] | None = None, days: float = 30
) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for an agent, valid for AGENT_TLS_SERVER_NAME plus `names`/`ips`."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    alt = [x509.DNSName(n) for n in [AGENT_TLS_SERVER_NAME, *(names or [])]]
    alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips or []]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(AGENT_TLS_SERVER_NAME))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return (
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
