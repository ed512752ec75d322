"""Keys and certificates of a consortium: one CA, the server's certificate, a key per site.

The server speaks TLS with a certificate signed by the consortium's CA; each site checks
it against ``ca.pem``. Each site proves who it is with its own key pair: the server
registers the public keys of the sites it expects, and refuses any other node.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fedbn_med.federation.names import LOOPBACK_HOSTS, NAME_RULE, is_plain_name

__all__ = ["ConsortiumFiles", "create_consortium", "parse_counts", "read_registered_counts",
           "read_site_keys", "registered_counts_path", "site_keys_path"]

SITE_KEYS = "sites.json"
#: Each site's training-example count, registered when its key is issued.
REGISTERED_COUNTS = "counts.json"
#: The largest count a site may register (the server's own bound on a claimed count).
_MAX_COUNT = 10**7


@dataclass(frozen=True)
class ConsortiumFiles:
    """Where each file of the consortium was written."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    site_keys: dict[str, tuple[Path, Path]]  # site -> (private key, public key)
    #: site -> a folder holding only what that site needs (its key and ca.pem)
    bundles: dict[str, Path] = field(default_factory=dict)

    def handout(self) -> str:
        """Return who gets which file, as a table to print."""
        rows = [("the server operator", f"{self.server_cert.name}, {self.server_key.name}, "
                 f"{self.ca_cert.name}, {SITE_KEYS} (which key is which site)"),
                ("keep offline", self.ca_key.name)]
        rows += [(f"site {site}", f"{self.bundles[site]}/: {priv.name} (secret), "
                  f"{self.ca_cert.name}" if site in self.bundles
                  else f"{priv.name} (secret), {self.ca_cert.name}")
                 for site, (priv, _) in self.site_keys.items()]
        width = max(len(r[0]) for r in rows)
        return "\n".join(f"{who:<{width}}  {what}" for who, what in rows)


def _write(path: Path, data: bytes, secret: bool) -> Path:
    # A secret is created 0600 (O_EXCL: never through an existing file or link), so no
    # other account can open it between its creation and a chmod.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return path


def site_keys_path(tls_dir: str | Path) -> Path:
    """Return the consortium's key list: which public key is which site (``sites.json``)."""
    return Path(tls_dir) / SITE_KEYS


def read_site_keys(tls_dir: str | Path) -> dict[str, str]:
    """Return ``{site: OpenSSH public key}`` from the consortium's ``sites.json``.

    Raises
    ------
    FileNotFoundError
        When the folder has no key list (made by ``pipelines/consortium_keys.py``).
    ValueError
        When the list is not ``{"SITE": "ecdsa-sha2-... KEY"}`` with plain site names,
        or names one key twice.
    """
    path = site_keys_path(tls_dir)
    if not path.is_file():
        raise FileNotFoundError(f"No key list {path}: the consortium's folder from "
                                "pipelines/consortium_keys.py has one.")
    try:
        keys = json.loads(path.read_text())
    except ValueError as err:
        raise ValueError(f"Key list {path} is not valid JSON: {err}.") from err
    if not isinstance(keys, dict) or not all(
            is_plain_name(k) and isinstance(v, str) and v for k, v in keys.items()):
        raise ValueError(f"Key list {path} must map plain site names ({NAME_RULE}) to "
                         "OpenSSH public keys.")
    if len(set(keys.values())) != len(keys):
        raise ValueError(f"Key list {path} gives one public key to several sites.")
    return keys


def registered_counts_path(tls_dir: str | Path) -> Path:
    """Return the consortium's registered example counts (``counts.json``)."""
    return Path(tls_dir) / REGISTERED_COUNTS


def read_registered_counts(tls_dir: str | Path) -> dict[str, int]:
    """Return ``{site: training examples}`` registered with the sites' keys.

    The server weighs each site by at most its registered count, and caps shares against
    registered counts, never against what other sites claim in a round. Empty when the
    consortium registered no counts.

    Raises
    ------
    ValueError
        When the file is not ``{"SITE": whole number from 1 to 10**7}``.
    """
    path = registered_counts_path(tls_dir)
    if not path.is_file():
        return {}
    try:
        counts = json.loads(path.read_text())
    except json.JSONDecodeError as err:  # its position only: never the file's contents
        raise ValueError(f"Registered counts {path} are not valid JSON (line {err.lineno}, "
                         f"column {err.colno}).") from None
    if not isinstance(counts, dict) or not all(
            is_plain_name(k) and isinstance(v, int) and not isinstance(v, bool)
            and 1 <= v <= _MAX_COUNT for k, v in counts.items()):
        raise ValueError(f"Registered counts {path} must map plain site names ({NAME_RULE}) "
                         f"to whole numbers of training examples from 1 to {_MAX_COUNT}.")
    return counts


def parse_counts(text: str) -> dict[str, int]:
    """Return ``{site: count}`` from ``"NYU=120,UM=80"`` (the key tool's ``--counts``).

    Examples
    --------
    >>> parse_counts("NYU=120, UM=80")
    {'NYU': 120, 'UM': 80}
    """
    counts: dict[str, int] = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        site, _, value = item.partition("=")
        if not value.strip().isdigit():
            raise ValueError(f"--counts takes SITE=N pairs separated by commas (N a whole "
                             f"number of training examples), got {item!r}.")
        counts[site.strip()] = int(value)
    return counts


def _check_counts(counts: dict[str, int], sites: Sequence[str]) -> None:
    missing = [s for s in sites if s not in counts]
    extra = sorted(set(counts) - set(sites))
    bad = {s: n for s, n in counts.items() if isinstance(n, bool) or not isinstance(n, int)
           or not 1 <= n <= _MAX_COUNT}
    if missing or extra or bad:
        raise ValueError(f"Registered counts must give every site ({', '.join(sites)}) a "
                         f"whole number of training examples from 1 to {_MAX_COUNT}; missing "
                         f"{missing}, unknown {extra}, out of range {bad}.")


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedbn-med consortium"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def create_consortium(out_dir: str | Path, server_hosts: Sequence[str], sites: Sequence[str],
                      *, days: int = 365, counts: dict[str, int] | None = None
                      ) -> ConsortiumFiles:
    """Create the CA, the server certificate (for ``server_hosts``) and a key per site.

    Parameters
    ----------
    out_dir : path
        An empty or new folder.
    server_hosts : sequence of str
        Names or IP addresses the sites use to reach the server (its certificate's SANs).
    sites : sequence of str
        Site names; each gets ``<site>.key`` (OpenSSH private key) and ``<site>.pub``.
    days : int
        Validity of the certificates.
    counts : dict of str to int, optional
        Each site's number of training examples, registered with its key
        (``counts.json``): the server weighs a site by at most this, whatever it claims.
    """
    if not server_hosts:
        raise ValueError("Name at least one server host (e.g. fl.consortium.example).")
    if not sites:
        raise ValueError("Name at least one site.")
    bad = [s for s in sites if not is_plain_name(s)]
    if bad or len(set(sites)) != len(sites):
        raise ValueError(f"Site names must be distinct and plain ({NAME_RULE}); got "
                         f"{list(sites)}.")
    if counts is not None:
        _check_counts(counts, sites)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    existing = [p.name for p in out.iterdir()]
    if existing:
        raise ValueError(f"{out} is not empty ({', '.join(sorted(existing)[:5])}); refusing to "
                         "overwrite a consortium's keys.")
    # The folder holds private keys: never committed, whichever repository it lands in.
    _write(out / ".gitignore", b"# a consortium's keys: never commit them\n*\n", False)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_cert = (x509.CertificateBuilder().subject_name(_name("fedbn-med CA"))
               .issuer_name(_name("fedbn-med CA")).public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                            crl_sign=True, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    sans: list[x509.GeneralName] = []
    # The server's own processes reach the SuperLink on loopback, over the same TLS.
    for host in dict.fromkeys([*server_hosts, *LOOPBACK_HOSTS]):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (x509.CertificateBuilder().subject_name(_name(server_hosts[0]))
                   .issuer_name(ca_cert.subject).public_key(server_key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5))
                   .not_valid_after(now + dt.timedelta(days=days))
                   .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                                  critical=True)
                   .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    files = ConsortiumFiles(
        ca_cert=_write(out / "ca.pem", ca_cert.public_bytes(pem), False),
        ca_key=_write(out / "ca.key", ca_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()), True),
        server_cert=_write(out / "server.pem", server_cert.public_bytes(pem), False),
        server_key=_write(out / "server.key", server_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()), True),
        site_keys={},
    )
    for site in sites:
        key = ec.generate_private_key(ec.SECP384R1())
        private = _write(out / f"{site}.key", key.private_bytes(
            pem, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()), True)
        public = _write(out / f"{site}.pub", key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH), False)
        files.site_keys[site] = (private, public)
    listing = {site: pub.read_text().strip() for site, (_, pub) in files.site_keys.items()}
    _write(site_keys_path(out), (json.dumps(listing, indent=1) + "\n").encode(), False)
    for site, (private, _) in files.site_keys.items():
        bundle = out / "bundles" / site
        bundle.mkdir(parents=True, mode=0o700)
        _write(bundle / private.name, private.read_bytes(), True)
        shutil.copyfile(files.ca_cert, bundle / files.ca_cert.name)
        files.bundles[site] = bundle
    if counts is not None:
        _write(registered_counts_path(out),
               (json.dumps(dict(counts), indent=1) + "\n").encode(), False)
    return files
