"""A throw-away certificate authority for the secure test servers, made with the openssl CLI.

Two CAs: ``ca`` signs the servers' certificate (SANs 127.0.0.1 and localhost) and a client certificate
(for mutual TLS); ``other_ca`` signs nothing this test run trusts, so a client given it as its CA must
fail the handshake ("wrong CA"). Keys are EC P-256 (fast to make), PKCS#8 PEM without a passphrase: what Kafka's PEM
key stores, ClickHouse's openSSL section, librdkafka and Python's ssl module all read. The extensions
(critical basicConstraints and keyUsage, key identifiers) satisfy Python 3.13's VERIFY_X509_STRICT.

Made once per test session into a temporary folder (tests/fixtures_security.py); never committed.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from glasspipe_dev.paths import NotInstalledError

DAYS = 30

_CA_EXT = """basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
"""

_LEAF_EXT = """basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = {usage}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
{san}"""


@dataclass(frozen=True)
class CertAndKey:
    cert: Path
    key: Path

    @property
    def chain_with_key(self) -> Path:
        """Key then certificate in one PEM file: Kafka's PEM key store format (ssl.keystore.type=PEM)."""
        return self.cert.with_name(self.cert.stem + "-keystore.pem")


@dataclass(frozen=True)
class Pki:
    """Every file the secure tests need, in one folder."""

    directory: Path
    ca: CertAndKey
    other_ca: CertAndKey
    server: CertAndKey
    client: CertAndKey
    rogue_client: CertAndKey  # a client certificate signed by ``other_ca``: the broker must refuse it

    @property
    def ca_cert(self) -> Path:
        return self.ca.cert

    @property
    def other_ca_cert(self) -> Path:
        return self.other_ca.cert


def _openssl() -> str:
    found = shutil.which("openssl")
    if not found:
        raise NotInstalledError("openssl is not installed: apt-get install openssl")
    return found


def _run(*args: str, cwd: Path) -> None:
    res = subprocess.run([_openssl(), *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60)
    if res.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed ({res.returncode}): {res.stderr.strip()}")


def _key(path: Path) -> None:
    _run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path), cwd=path.parent)
    path.chmod(0o600)


def make_ca(directory: Path, name: str) -> CertAndKey:
    pair = CertAndKey(directory / f"{name}.crt", directory / f"{name}.key")
    _key(pair.key)
    ext = directory / f"{name}.ext"
    ext.write_text(_CA_EXT)
    _run("req", "-x509", "-new", "-key", str(pair.key), "-sha256", "-days", str(DAYS), "-subj",
         f"/O=glasspipe tests/CN={name}", "-extensions", "v3_ca_gp", "-config", str(_config(directory, ext)),
         "-out", str(pair.cert), cwd=directory)
    return pair


def _config(directory: Path, ext: Path) -> Path:
    """A minimal openssl.cnf whose [v3_ca_gp] section is ``ext`` (req -x509 takes extensions from a config)."""
    cnf = ext.with_suffix(".cnf")
    cnf.write_text("[req]\ndistinguished_name = dn\n[dn]\n[v3_ca_gp]\n" + ext.read_text())
    return cnf


def make_leaf(directory: Path, name: str, ca: CertAndKey, *, server: bool) -> CertAndKey:
    """A certificate signed by ``ca``: for a server (SANs 127.0.0.1, localhost) or a client (CN only)."""
    pair = CertAndKey(directory / f"{name}.crt", directory / f"{name}.key")
    _key(pair.key)
    csr = directory / f"{name}.csr"
    _run("req", "-new", "-key", str(pair.key), "-subj", f"/O=glasspipe tests/CN={name}", "-out", str(csr),
         cwd=directory)
    ext = directory / f"{name}.ext"
    ext.write_text(_LEAF_EXT.format(
        usage="serverAuth" if server else "clientAuth",
        san="subjectAltName = IP:127.0.0.1, DNS:localhost\n" if server else "",
    ))
    _run("x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key), "-CAcreateserial",
         "-sha256", "-days", str(DAYS), "-extfile", str(ext), "-out", str(pair.cert), cwd=directory)
    pair.chain_with_key.write_text(pair.key.read_text() + pair.cert.read_text())
    pair.chain_with_key.chmod(0o600)
    return pair


def make_pki(directory: Path) -> Pki:
    """Two CAs, a server certificate and two client certificates in ``directory`` (~1 s)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(directory, "glasspipe-test-ca")
    other = make_ca(directory, "unrelated-ca")
    return Pki(
        directory=directory,
        ca=ca,
        other_ca=other,
        server=make_leaf(directory, "server", ca, server=True),
        client=make_leaf(directory, "client", ca, server=False),
        rogue_client=make_leaf(directory, "rogue-client", other, server=False),
    )
