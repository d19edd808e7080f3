"""Throwaway TLS material for tests: a self-signed CA and certificates it signs, written as
PEM files (Python ``cryptography``, which Airflow already depends on).

Keys are PKCS#8 (``BEGIN PRIVATE KEY``), the form both librdkafka and the Java client
read; :func:`write_key` writes the other forms for tests of the translation's refusals.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    """A certificate and its key as PEM files."""

    cert: Path
    key: Path
    private_key: ec.EllipticCurvePrivateKey


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def write_key(
    key: ec.EllipticCurvePrivateKey, path: Path, *, form: str = "pkcs8", password: str | None = None
) -> Path:
    """``key`` as PEM: ``pkcs8`` (``BEGIN PRIVATE KEY``, or ``BEGIN ENCRYPTED PRIVATE KEY``
    with ``password``) or ``traditional`` (OpenSSL's ``BEGIN EC PRIVATE KEY``)."""
    fmt = (
        serialization.PrivateFormat.PKCS8
        if form == "pkcs8"
        else serialization.PrivateFormat.TraditionalOpenSSL
    )
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    )
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, fmt, encryption))
    return path


def make_ca(folder: Path, name: str = "eo-test-ca") -> Issued:
    """A self-signed CA valid for a day either side of now."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + _DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
    folder.mkdir(parents=True, exist_ok=True)
    cert_path = folder / f"{name}.crt"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Issued(cert=cert_path, key=write_key(key, folder / f"{name}.key"), private_key=key)


def issue(ca: Issued, folder: Path, name: str, *, server: bool) -> Issued:
    """A certificate signed by ``ca``: for a server on 127.0.0.1/localhost (both in the
    subject alternative names, so hostname verification passes) or for a client."""
    key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + _DAY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    cert = builder.sign(ca.private_key, hashes.SHA256())
    cert_path = folder / f"{name}.crt"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Issued(cert=cert_path, key=write_key(key, folder / f"{name}.key"), private_key=key)
