"""The tests' certificates, made and read one way (the openssl command): a CA, a certificate
it signs for a subject and names, the names a certificate holds, and whether a CA verifies
a certificate. Used by the control plane's PKI and every test that makes its own."""
from __future__ import annotations

import re
import ssl
import subprocess
from pathlib import Path
from typing import NamedTuple

KEYS = {"rsa": ["-newkey", "rsa:2048"], "ec": ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]}


class Pair(NamedTuple):
    crt: Path
    key: Path


def openssl(*args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["openssl", *args], check=True, capture_output=True, input=stdin).stdout


def san_list(names) -> str:
    """subjectAltName's value for DNS names and IP addresses."""
    return ",".join(f"IP:{n}" if re.fullmatch(r"[0-9.]+|[0-9a-fA-F:]*:[0-9a-fA-F:]*", n) else f"DNS:{n}"
                    for n in names)


def ca(d: Path, stem: str, cn: str | None = None, key: str = "ec", days: int = 2) -> Pair:
    """A self-signed CA: d/<stem>.crt and d/<stem>.key."""
    pair = Pair(d / f"{stem}.crt", d / f"{stem}.key")
    openssl("req", "-x509", *KEYS[key], "-nodes", "-days", str(days), "-subj", f"/CN={cn or stem}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-keyout", str(pair.key), "-out", str(pair.crt))
    return pair


def issue(d: Path, stem: str, by: Pair, *, names=(), subject: str | None = None, usage: str = "serverAuth",
          key: str = "ec", days: int = 2) -> Pair:
    """A certificate signed by `by`: d/<stem>.crt and d/<stem>.key, for `names` (DNS names or IP
    addresses; the subject's CN is the first unless `subject` is given), for `usage`."""
    pair = Pair(d / f"{stem}.crt", d / f"{stem}.key")
    csr, ext = d / f"{stem}.csr", d / f"{stem}.ext"
    lines = [f"extendedKeyUsage={usage}"]
    if names:
        lines.insert(0, f"subjectAltName={san_list(names)}")
    ext.write_text("\n".join(lines) + "\n")
    openssl("req", *KEYS[key], "-nodes", "-subj", subject or f"/CN={list(names)[0]}", "-keyout", str(pair.key),
            "-out", str(csr))
    openssl("x509", "-req", "-in", str(csr), "-CA", str(by.crt), "-CAkey", str(by.key), "-CAcreateserial",
            "-days", str(days), "-extfile", str(ext), "-out", str(pair.crt))
    return pair


def sans(pem: bytes) -> list[str]:
    """The subjectAltName entries of a PEM certificate, in order, without their type."""
    out = openssl("x509", "-noout", "-ext", "subjectAltName", stdin=pem).decode()
    lines = out.strip().splitlines()
    return [n.split(":", 1)[1] for n in lines[1].strip().split(", ")] if len(lines) > 1 else []


def der_certs(pem: bytes) -> list[bytes]:
    """The certificates of a PEM bundle, as DER, in order."""
    return [ssl.PEM_cert_to_DER_cert(m.decode()) for m in
            re.findall(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----\n?", pem, re.S)]


def verifies(ca_pem: bytes, leaf_der: bytes, tmp: Path) -> bool:
    """openssl verifies the certificate against the CA (signature, validity, CA flags)."""
    (tmp / "leaf.pem").write_text(ssl.DER_cert_to_PEM_cert(leaf_der))
    (tmp / "ca.pem").write_bytes(ca_pem)
    p = subprocess.run(["openssl", "verify", "-CAfile", str(tmp / "ca.pem"), str(tmp / "leaf.pem")],
                       capture_output=True, text=True)
    return p.returncode == 0
