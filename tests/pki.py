"""Certificates for TLS tests, made with the openssl command (Debian's): a CA, a server
certificate it signs for 127.0.0.1 and localhost, a client certificate, another CA nobody
trusts, and a self-signed server certificate (to pin). A machine without the openssl command
(the device machine of docs/gpu.md, perhaps) takes the files of one made elsewhere from the
directory $KVSTORE_TEST_PKI names (scripts/device_wheels.sh makes one; they are valid two days)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str
    pinned_cert: str
    pinned_key: str


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
             cwd=d)  # fmt: skip


def _signed(d: Path, name: str, ca: str, usage: str) -> None:
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n")
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", ext.name, cwd=d)  # fmt: skip


_FILES = ("ca.pem", "server.pem", "server.key", "client.pem", "client.key", "other-ca.pem", "pinned.pem", "pinned.key")


def make_pki(d: Path) -> Pki:
    d.mkdir(parents=True, exist_ok=True)
    made = os.environ.get("KVSTORE_TEST_PKI", "")
    if made and shutil.which("openssl") is None:
        for name in _FILES:
            shutil.copy(Path(made) / name, d / name)
        return _pki(d)
    _ca(d, "ca")
    _ca(d, "other-ca")
    _signed(d, "server", "ca", "serverAuth,clientAuth")
    _signed(d, "client", "ca", "clientAuth")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "pinned.key", "-out", "pinned.pem", "-days", "2", "-subj", "/CN=pinned",
             "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", cwd=d)  # fmt: skip
    return _pki(d)


def _pki(d: Path) -> Pki:
    p = str(d)
    return Pki(f"{p}/ca.pem", f"{p}/server.pem", f"{p}/server.key", f"{p}/client.pem", f"{p}/client.key",
               f"{p}/other-ca.pem", f"{p}/pinned.pem", f"{p}/pinned.key")  # fmt: skip
