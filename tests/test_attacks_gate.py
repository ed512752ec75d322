"""The public port attacked by an outsider with no key: slow, idle, heavy and unsigned clients.

One SuperLink with TLS and node authentication, behind the gate
(:mod:`fedbn_med.federation.launcher.fleet_gate`) with short timeouts, a small memory
budget and a low descriptor limit, so each attack shows within seconds. Every client
here runs on 127.0.0.1, as the sites do: nothing is told apart by address.
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import threading
import time
from base64 import b64encode

import httpx
import psutil
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedbn_med.federation import _flwr_compat as flwr_compat
from fedbn_med.federation.consortium import create_consortium
from fedbn_med.federation.launcher import LocalFederation, TlsFiles, free_port
from fedbn_med.federation.launcher.fleet_gate import SIGNATURE_HEADERS, TIMESTAMP_WINDOW, GateLimits
from fedbn_med.federation.node import _load_auth_keys

pytestmark = pytest.mark.integration

LIMITS = GateLimits(header_timeout=1.5, body_timeout=1.5, min_rate=2 << 20,
                    max_inflight=16 << 20, rate=2.0, burst=40.0, refusal_rate=20.0)
MAX_BODY = 4 << 20
GATE_401 = "Refused: this port takes only signed Flower SuperNode requests."
FD_LIMIT = 200  # the gate keeps 160 for itself and the SuperLink: 40 client connections


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate")
    keys = create_consortium(root / "keys", ["127.0.0.1"], ["NYU", "EVE"])
    tls = TlsFiles(keys.ca_cert, keys.server_cert, keys.server_key)
    with LocalFederation(root / "fed", tls=tls, node_auth=True) as fed:
        fed.start_superlink()
        fed.register_site_key(keys.site_keys["NYU"][1])  # EVE's key is made, not registered
        port = free_port()
        fed.start_gate("127.0.0.1", port, max_body=MAX_BODY, limits=LIMITS,
                       fd_limit=FD_LIMIT)
        yield {"fed": fed, "port": port, "keys": keys,
               "gate": psutil.Process(fed.processes["gate"].pid),
               "superlink": psutil.Process(fed.processes["superlink"].pid)}


def _tls(g: dict) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(g["keys"].ca_cert))


def _connect(g: dict, handshake: bool = True) -> socket.socket:
    raw = socket.create_connection(("127.0.0.1", g["port"]), timeout=10)
    return _tls(g).wrap_socket(raw, server_hostname="127.0.0.1") if handshake else raw


def _signed(g: dict, site: str = "NYU") -> dict[str, str]:
    """Flower's SuperNode signature headers, made as its interceptor makes them."""
    key = serialization.load_ssh_private_key(g["keys"].site_keys[site][0].read_bytes(), None)
    stamp = dt.datetime.now(dt.timezone.utc).isoformat()
    pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    signature = key.sign(stamp.encode("ascii"), ec.ECDSA(hashes.SHA256()))
    return dict(zip(SIGNATURE_HEADERS, (b64encode(pem).decode(), stamp,
                                        b64encode(signature).decode())))


def _head(size: int, headers: dict[str, str] | None = None) -> bytes:
    lines = ["POST /v1/fleet/pull-messages HTTP/1.1", "Host: fl.example",
             "Content-Type: application/protobuf", f"Content-Length: {size}",
             *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        sock.settimeout(0.2)
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError, OSError):
        return True


def _site_gets_in(g: dict) -> int:
    session = flwr_compat.FleetSession(
        f"127.0.0.1:{g['port']}", insecure=False,
        root_certificates=g["keys"].ca_cert.read_bytes(),
        authentication_keys=_load_auth_keys(g["keys"].site_keys["NYU"][0]), max_wait_time=10)
    try:
        node = session.open()
        session.receive()
        return node
    finally:
        session.close()


def test_the_gate_reads_flowers_own_signature_headers():
    from flwr.common.constant import SYSTEM_TIME_TOLERANCE, TIMESTAMP_HEADER, TIMESTAMP_TOLERANCE
    from flwr.supercore.constant import FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER

    assert SIGNATURE_HEADERS == (FLEET_HTTP_PUBLIC_KEY_HEADER, TIMESTAMP_HEADER,
                                 FLEET_HTTP_SIGNATURE_HEADER)
    assert TIMESTAMP_WINDOW == (SYSTEM_TIME_TOLERANCE, TIMESTAMP_TOLERANCE + SYSTEM_TIME_TOLERANCE)


def test_idle_and_slow_clients_are_cut_off(gate):
    g = gate
    silent = [_connect(g, handshake=False) for _ in range(3)]  # never start TLS
    idle = [_connect(g) for _ in range(3)]  # TLS, then nothing
    partial = [_connect(g) for _ in range(3)]  # half a request head
    for sock in partial:
        sock.sendall(b"POST /v1/fleet/pull-messages HTTP/1.1\r\nHost: x\r\n")
    trickle = [_connect(g) for _ in range(3)]  # a signed head, then a body that stalls
    for sock in trickle:
        sock.sendall(_head(1000, _signed(g)) + b"\0" * 10)
    everyone = silent + idle + partial + trickle
    # header and body timeouts are 1.5 s (plus 1000 bytes at 2 MiB/s for the body)
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and not all(map(_closed_by_peer, everyone)):
        time.sleep(0.3)
    assert [_closed_by_peer(s) for s in everyone] == [True] * len(everyone)
    for sock in everyone:
        sock.close()


def test_idle_connections_cannot_lock_the_sites_out(gate):
    g = gate
    # more idle connections than the gate has descriptors
    crowd = [_connect(g, handshake=False) for _ in range(FD_LIMIT + 50)]
    try:
        assert _site_gets_in(g) > 0
        assert g["gate"].is_running() and g["gate"].num_fds() < FD_LIMIT
    finally:
        for sock in crowd:
            sock.close()


def test_bodies_in_flight_are_bounded_and_memory_comes_back(gate):
    g = gate
    before = g["gate"].memory_info().rss
    size = MAX_BODY - 4096  # just under the limit
    body = b"\0" * size
    clients = []
    for _ in range(30):  # 120 MiB of bodies; the gate holds at most 16 MiB of them
        sock = _connect(g)
        sock.sendall(_head(size, _signed(g)))
        sock.setblocking(False)
        clients.append([sock, memoryview(body)])
    peak = before
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and any(len(rest) for _, rest in clients):
        for client in clients:
            sock, rest = client
            try:
                while len(rest):
                    rest = rest[sock.send(rest[:1 << 16]):]
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                pass
            except (ConnectionError, ssl.SSLError, OSError):
                rest = rest[:0]
            client[1] = rest
        peak = max(peak, g["gate"].memory_info().rss)
        time.sleep(0.02)
    for sock, _ in clients:
        sock.close()
    mib = 1 << 20
    # Unbounded, the gate would hold the 120 MiB of bodies (twice, with the copy for the
    # SuperLink). Bounded, it holds 16 MiB of bodies plus what is not counted against the
    # budget: TLS and stream buffers of 30 connections and the allocator's slack, which
    # reached 55 MiB in all once on a loaded 2-core machine.
    assert peak - before < 64 * mib, (before / mib, peak / mib)
    # what the gate had taken in goes back once it has dealt with it
    deadline = time.monotonic() + 8
    while (after := g["gate"].memory_info().rss) - before >= 16 * mib and \
            time.monotonic() < deadline:
        time.sleep(0.25)
    assert after - before < 16 * mib, (before / mib, peak / mib, after / mib)


def test_unsigned_requests_never_reach_the_superlink(gate):
    g = gate
    superlink = g["superlink"]
    answers: dict[object, int] = {}
    lock = threading.Lock()
    stop = time.monotonic() + 3.0

    def flood() -> None:
        while time.monotonic() < stop:
            with httpx.Client(base_url=f"https://127.0.0.1:{g['port']}", verify=_tls(g),
                              timeout=5) as client:
                try:
                    while time.monotonic() < stop:
                        answer = client.post("/v1/fleet/pull-messages",
                                             content=b"\x0a\x02\x08\x01")
                        key = (answer.status_code, answer.text)
                        with lock:
                            answers[key] = answers.get(key, 0) + 1
                except httpx.HTTPError:  # refused too often: the gate hung up
                    with lock:
                        answers["closed"] = answers.get("closed", 0) + 1

    cpu_before = sum(superlink.cpu_times()[:2])
    threads = [threading.Thread(target=flood) for _ in range(4)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    node = _site_gets_in(g)  # a site with its key gets in meanwhile
    took = time.monotonic() - started
    for thread in threads:
        thread.join()
    cpu = sum(superlink.cpu_times()[:2]) - cpu_before
    assert node > 0 and took < 10, took
    # every one was answered by the gate itself (Flower says "Invalid SuperNode
    # authentication"), or, once they came too fast, hung up on
    assert set(answers) <= {(401, GATE_401), "closed"}, answers
    assert sum(answers.values()) >= 20, answers
    # what the SuperLink spent is the site's few calls, not the flood's
    assert cpu < 0.5, (cpu, answers)
    # an unregistered key that signs correctly is refused at the gate too (once this IP's
    # refusal allowance, drained by the flood, has filled up again)
    time.sleep(2.2)
    with httpx.Client(base_url=f"https://127.0.0.1:{g['port']}", verify=_tls(g)) as client:
        answer = client.post("/v1/fleet/pull-messages", content=b"\x0a\x02\x08\x01",
                             headers=_signed(g, "EVE"))
    assert answer.status_code == 401 and "signature" in answer.text


def test_a_key_over_its_rate_gets_429(gate):
    g = gate
    statuses = []
    # The module's gate is shared: let this IP's refusal allowance (drained by the flood
    # test) fill up again, so that the 429s come before any hang-up.
    time.sleep(2.2)  # the burst (2 x refusal_rate) refills at refusal_rate a second
    with httpx.Client(base_url=f"https://127.0.0.1:{g['port']}", verify=_tls(g)) as client:
        started = time.monotonic()
        for _ in range(80):
            try:
                statuses.append(client.post("/v1/fleet/pull-messages", content=b"",
                                            headers=_signed(g)).status_code)
            except httpx.TransportError:
                # Refused faster than refusal_rate: the gate hangs up, as designed.
                assert 429 in statuses
                break
        took = time.monotonic() - started
    passed = len([s for s in statuses if s != 429])
    assert 429 in statuses
    assert passed <= LIMITS.burst + LIMITS.rate * took + 1, (passed, took)
