"""A certificate authority and a server certificate made for a test, with Debian's `openssl`:
for DNS over TLS stubs on loopback."""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certificates:
    """The files: the CA's certificate, and the server's certificate and key."""

    ca: Path
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        """What a TLS server presenting the certificate needs."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context


def make_certificates(directory: Path, names: tuple[str, ...]) -> Certificates:
    """A CA, and a certificate it signs for `names` (DNS names, or IP addresses), valid a day."""
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key, request = (
        directory / "server.pem",
        directory / "server.key",
        directory / "server.csr",
    )
    alt = ",".join(f"IP:{name}" if name[:1].isdigit() else f"DNS:{name}" for name in names)
    (directory / "ca.cnf").write_text(
        "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n"
        "subjectKeyIdentifier=hash\n"
    )
    (directory / "server.cnf").write_text(
        f"subjectAltName={alt}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    subject = ["-subj", "/CN=toposdns test CA"]
    config = ["-extensions", "v3", "-config", _config(directory)]
    run(
        [
            "openssl",
            "req",
            "-x509",
            *ec,
            "-keyout",
            ca_key,
            "-out",
            ca,
            "-days",
            "1",
            *subject,
            *config,
        ]
    )
    run(["openssl", "req", *ec, "-keyout", key, "-out", request, "-subj", f"/CN={names[0]}"])
    signed = ["-CAcreateserial", "-out", cert, "-days", "1", "-extfile", directory / "server.cnf"]
    run(["openssl", "x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, *signed])
    return Certificates(ca, cert, key)


def _config(directory: Path) -> Path:
    """An openssl configuration whose `v3` section is the CA's extensions."""
    path = directory / "openssl.cnf"
    extensions = (directory / "ca.cnf").read_text()
    path.write_text(f"[req]\ndistinguished_name=dn\n[dn]\n[v3]\n{extensions}")
    return path


def run(command: list[str | Path]) -> None:
    subprocess.run([str(part) for part in command], check=True, capture_output=True, timeout=30)
