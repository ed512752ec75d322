"""TLS and site authentication on a real SuperLink on 127.0.0.1."""

from __future__ import annotations

import pytest

from fedbn_med.federation.consortium import create_consortium
from fedbn_med.federation.launcher import LocalFederation, TlsFiles
from fedbn_med.federation.run import run_site

pytestmark = pytest.mark.integration


def test_consortium_files_and_handout(tmp_path):
    files = create_consortium(tmp_path / "keys", ["127.0.0.1", "fl.example.org"], ["NYU", "UM"])
    assert files.ca_cert.read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert files.site_keys["NYU"][0].read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY")
    assert files.site_keys["UM"][1].read_text().startswith("ecdsa-sha2-nistp384 ")
    assert oct(files.site_keys["NYU"][0].stat().st_mode & 0o777) == "0o600"
    text = files.handout()
    assert "site NYU" in text and "NYU.key (secret)" in text and "ca.key" in text
    with pytest.raises(ValueError, match="not empty"):
        create_consortium(tmp_path / "keys", ["127.0.0.1"], ["NYU"])


def test_only_registered_sites_that_trust_the_ca_get_in(small_cohort, tmp_path):
    keys = create_consortium(tmp_path / "keys", ["127.0.0.1"], ["NYU", "UM"])
    other = create_consortium(tmp_path / "other", ["127.0.0.1"], ["NYU"])
    tls = TlsFiles(keys.ca_cert, keys.server_cert, keys.server_key)
    with LocalFederation(tmp_path / "fed", tls=tls, node_auth=True) as fed:
        fed.start_superlink()
        fed.register_site_key(keys.site_keys["NYU"][1])
        address = f"127.0.0.1:{fed.port}"
        # registered, trusts the consortium CA: connects
        fed.start_site("NYU", data_dir=small_cohort, device="cpu", threads=1,
                       auth_key=keys.site_keys["NYU"][0])
        fed.wait_sites_ready(["NYU"], timeout=180)
        # a key the server never registered: refused, never receives work (each try is
        # refused at once: a short wait bound shows it as well as a long one)
        with pytest.raises(ConnectionError, match="could not reach"):
            run_site("UM", address, state_dir=tmp_path / "um", root_certificates=keys.ca_cert,
                     auth_key=keys.site_keys["UM"][0], max_wait_time=2.0)
        # a site that trusts another CA cannot connect
        with pytest.raises(ConnectionError, match="could not reach"):
            run_site("NYU", address, state_dir=tmp_path / "nyu2",
                     root_certificates=other.ca_cert, auth_key=keys.site_keys["NYU"][0],
                     max_wait_time=2.0)


def test_the_key_folder_ignores_itself_and_each_site_gets_only_its_bundle(tmp_path):
    files = create_consortium(tmp_path / "keys", ["127.0.0.1"], ["NYU", "UM"])
    assert (tmp_path / "keys" / ".gitignore").read_text().splitlines()[-1] == "*"
    for site, (private, _) in files.site_keys.items():
        bundle = files.bundles[site]
        assert sorted(p.name for p in bundle.iterdir()) == sorted([f"{site}.key", "ca.pem"])
        assert (bundle / f"{site}.key").read_bytes() == private.read_bytes()
        assert (bundle / f"{site}.key").stat().st_mode & 0o777 == 0o600
        assert private.stat().st_mode & 0o777 == 0o600
        assert f"{bundle}/" in files.handout()
    assert files.ca_key.stat().st_mode & 0o777 == 0o600
