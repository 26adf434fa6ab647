"""Self-signed TLS certificate for ``gmp viz`` bound beyond loopback.

Generated in Python with the ``cryptography`` package (EC P-256, SAN: localhost, 127.0.0.1, ::1, the
host name and the bound address), stored in the user cache with a 0600 key and reused while it is valid
and covers the requested names, so a browser exception has to be accepted only once per machine.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import socket
from pathlib import Path

from .assets import ensure_cache_root
from .errors import VizDependencyError

__all__ = ["ensure_certificate", "wanted_names"]

_VALID_DAYS = 825


def wanted_names(bind_host: str) -> tuple[list[str], list[str]]:
    """``(dns_names, ip_addresses)`` the certificate must cover for a server bound to ``bind_host``."""
    dns = {"localhost"}
    ips = {"127.0.0.1", "::1"}
    hostname = socket.gethostname()
    if hostname:
        dns.add(hostname)
    for name in (bind_host,):
        if not name or name in ("0.0.0.0", "::"):  # noqa: S104 - wildcard has no certificate name
            continue
        try:
            ips.add(str(ipaddress.ip_address(name)))
        except ValueError:
            dns.add(name)
    return sorted(dns), sorted(ips)


def _covers(cert_path: Path, dns: list[str], ips: list[str]) -> bool:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError):
        return False
    now = _dt.datetime.now(_dt.timezone.utc)
    if cert.not_valid_after_utc < now + _dt.timedelta(days=7):
        return False
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have_dns = set(san.get_values_for_type(x509.DNSName))
    have_ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return set(dns) <= have_dns and set(ips) <= have_ips


def ensure_certificate(bind_host: str, *, cache_dir: Path | None = None) -> tuple[Path, Path]:
    """Return ``(cert_pem, key_pem)`` valid for ``bind_host``, generating a new pair when needed."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError as exc:  # pragma: no cover - cryptography is a declared dependency
        raise VizDependencyError(
            "serving HTTPS needs the cryptography package", hint="pip install cryptography"
        ) from exc

    root = ensure_cache_root(cache_dir)
    cert_path, key_path = root / "tls-cert.pem", root / "tls-key.pem"
    dns, ips = wanted_names(bind_host)
    if cert_path.is_file() and key_path.is_file() and _covers(cert_path, dns, ips):
        return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gmp viz (self-signed)")])
    now = _dt.datetime.now(_dt.timezone.utc)
    san = x509.SubjectAlternativeName(
        [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=_VALID_DAYS))
        .add_extension(san, critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    key_bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    tmp_key = key_path.with_name(f".{key_path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key_bytes)
    os.replace(tmp_key, key_path)
    tmp_cert = cert_path.with_name(f".{cert_path.name}.{os.getpid()}.tmp")
    tmp_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    os.replace(tmp_cert, cert_path)
    return cert_path, key_path
