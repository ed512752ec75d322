"""The plain-name rule and the loopback rule, and that every boundary uses the same ones."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from fedbn_med.federation.names import (
    LOOPBACK_HOSTS,
    SITE_NAME,
    check_name,
    is_loopback,
    is_plain_name,
)


@pytest.mark.parametrize("name", ["UCLA", "LEUVEN_2", "site-7", "a", "N" * 64])
def test_plain_names_pass(name):
    assert is_plain_name(name) and check_name(name) == name


@pytest.mark.parametrize("name", ["", "N" * 65, "../etc", "a/b", "a.b", "a b", "UCLA\n",
                                  "é", None, 5, b"UCLA"])
def test_anything_else_is_refused_naming_the_value_and_the_rule(name):
    assert not is_plain_name(name)
    with pytest.raises(ValueError, match=r"^A site's name must be 1 to 64 letters, digits, "
                                         r"'-' or '_', got .+\.$") as err:
        check_name(name)
    assert repr(name)[:20] in str(err.value)


def test_the_message_says_what_the_name_is_and_why_and_stays_short():
    with pytest.raises(ValueError, match=r"^federation_id must be 1 to 64 letters, digits, '-' "
                                         r"or '_' \(it names a folder\), got 'a/b'\.$"):
        check_name("a/b", "federation_id", "it names a folder")
    with pytest.raises(ValueError, match=r"got 'NNNN.*\.\.\. \(5002 characters\)\.$") as err:
        check_name("N" * 5000)
    assert len(str(err.value)) < 200


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "127.255.255.254", "::1", "[::1]",
                                  "localhost", "LocalHost", "::ffff:127.0.0.1",
                                  "0:0:0:0:0:0:0:1", *LOOPBACK_HOSTS])
def test_loopback_hosts(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]", "", "128.0.0.1", "10.0.0.1",
                                  "192.168.1.1", "::2", "::ffff:10.0.0.1", "localhost.evil.com",
                                  "evil.localhost", "localhost:9092", "127.0.0.1:9092",
                                  "[::1", "::1]", "[127.0.0.1]", " localhost",
                                  "fl.consortium.example"])
def test_not_loopback(host):
    assert not is_loopback(host)


def test_the_rule_module_imports_nothing_heavy():
    code = ("import sys; import fedbn_med.federation.names, fedbn_med.tasks.site_toml; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch', 'flwr', 'mlflow', 'numpy', 'cryptography', 'monai'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]"


# -- every boundary uses the one rule ------------------------------------------------------
def test_the_boundaries_share_the_pattern():
    from fedbn_med.federation import config, consortium
    from fedbn_med.federation.server import checks
    from fedbn_med.tasks import site_toml

    for module in (config, consortium, checks, site_toml):
        assert not any(isinstance(v, type(SITE_NAME)) and v.pattern == SITE_NAME.pattern
                       and v is not SITE_NAME for v in vars(module).values()), module


@pytest.mark.parametrize("bad", ["../x", "a b", "N" * 65])
def test_each_boundary_refuses_the_same_names(tmp_path, bad, monkeypatch):
    from fedbn_med.cli.parser import _site_name
    from fedbn_med.federation.config import NodeSettings, ServerSettings
    from fedbn_med.federation.consortium import create_consortium
    from fedbn_med.tasks.abide.sites import load_site
    from fedbn_med.tasks.site_toml import share_private_layers, site_policy

    monkeypatch.setenv("FEDBN_MED_SITES", str(tmp_path))
    rule = "1 to 64 letters, digits, '-' or '_'"
    with pytest.raises(ValueError, match=f"^federation_id must be {rule}"):
        ServerSettings(workdir=tmp_path, federation_id=bad)
    with pytest.raises(ValueError, match=f"^The node config's site must be {rule}"):
        NodeSettings(site=bad, state_dir=tmp_path)
    with pytest.raises(ValueError, match=f"^Refused federation id .* from the server: "
                                         f"expected {rule}"):
        NodeSettings(site="UCLA", state_dir=tmp_path).state_path(bad)
    with pytest.raises(ValueError, match=f"^A site's name must be {rule} \\(it names"):
        load_site(bad, tmp_path)
    for read in (share_private_layers, site_policy):
        with pytest.raises(ValueError, match=f"^A site's name must be {rule} \\(it names"):
            read(bad)
    with pytest.raises(ValueError, match=f"^Site names must be distinct and plain \\({rule}\\)"):
        create_consortium(tmp_path / "keys", ["127.0.0.1"], [bad])
    with pytest.raises(argparse.ArgumentTypeError, match=f"a site's name is {rule}"):
        _site_name(bad)


def test_a_site_file_with_a_bad_name_is_refused(tmp_path):
    from fedbn_med.tasks.site_toml import read_site_file

    path = tmp_path / "a b.toml"
    path.write_text("")
    with pytest.raises(ValueError, match=r"^Site file .*a b\.toml: a site's name must be 1 to "
                                         r"64 letters, digits, '-' or '_', got 'a b'\.$"):
        read_site_file(path, set())


# -- every loopback decision uses the one rule ----------------------------------------------
@pytest.mark.parametrize("superlink", ["127.0.0.2:9092", "[::1]:9092", "localhost:9092"])
def test_a_site_dials_loopback_without_tls(superlink, tmp_path, monkeypatch):
    import fedbn_med.federation.node as node

    dialed = []
    monkeypatch.setattr(node, "run_node", lambda address, *a, **k: dialed.append(address))
    from fedbn_med.federation.run import run_site

    run_site("UCLA", superlink, state_dir=tmp_path)
    assert dialed == [superlink]


@pytest.mark.parametrize("superlink", ["0.0.0.0:9092", "localhost.evil.com:9092",
                                       "10.0.0.1:9092"])
def test_a_site_refuses_clear_text_beyond_this_host(superlink, tmp_path):
    from fedbn_med.federation.run import run_site

    with pytest.raises(ValueError, match=f"The federation server {superlink} is not on this "
                                         "host, so the connection must use TLS"):
        run_site("UCLA", superlink, state_dir=tmp_path)


@pytest.mark.parametrize(("listen", "refused"), [("127.0.0.2:9092", False),
                                                 ("[::1]:9092", False),
                                                 ("0.0.0.0:9092", True),
                                                 ("localhost.evil.com:9092", True)])
def test_the_server_refuses_to_listen_beyond_this_host_without_tls(listen, refused, tmp_path,
                                                                   monkeypatch):
    import fedbn_med.federation.run as run
    from fedbn_med.cli.hosts import serve_mode
    from fedbn_med.cli.parser import build_parser
    from fedbn_med.spec import RunSpec

    served = []
    monkeypatch.setattr(run, "serve", lambda spec, options: served.append(options) or
                        {"table": ""})
    args = build_parser().parse_args(["--serve", "--listen", listen])
    if refused:
        with pytest.raises(ValueError, match="beyond this host, without TLS"):
            serve_mode(args, RunSpec(), "", tmp_path)
        assert not served
    else:
        assert serve_mode(args, RunSpec(), "", tmp_path) == 0
        assert len(served) == 1


def test_the_server_certificate_names_every_loopback_host(tmp_path):
    import ipaddress

    from cryptography import x509

    from fedbn_med.federation.consortium import create_consortium

    files = create_consortium(tmp_path / "keys", ["fl.example.org"], ["NYU"])
    cert = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {"fl.example.org", "localhost"}
    assert set(sans.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
