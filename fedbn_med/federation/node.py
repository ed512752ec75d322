"""A long-lived site node: one process per site, speaking Flower's Fleet API.

``flower-supernode`` in flwr 1.42 starts a fresh ClientApp process for every message,
which re-imports torch and MONAI and reloads the site's data each time (seconds per
message), and it polls with fixed 3 s / 0.5 s sleeps. This node registers with the
SuperLink exactly as a SuperNode does (same Fleet API, same heartbeats, TLS and node
authentication), but runs the ClientApp inside its own process: imports, data loading
and model set-up happen once per site, and the private state stays in memory between
rounds (and on disk after each round).

The Fleet connection is :class:`fedbn_med.federation._flwr_compat.FleetSession`, the one
place that uses flwr internals. With ``--events-fd`` the node reports its readiness, a
lost server and a failure as typed events (:mod:`fedbn_med.federation.events`) on that
pipe, for the launcher.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
from flwr.app import Context, Error, Message, MessageType, RecordDict

from fedbn_med.federation import _flwr_compat as flwr_compat
from fedbn_med.federation.config import APP_HASH_KEY, NodeSettings
from fedbn_med.federation.events import Event, NodeFailed, NodeLost, NodeReady, emit, shorten
from fedbn_med.federation.pacing import Pacer
from fedbn_med.federation.site_console import SiteConsole
from fedbn_med.spec import RUN_CONFIG_KEY
from fedbn_med.tasks.site_toml import SitePolicy, site_policy

__all__ = ["MAX_MESSAGE_OBJECTS", "main", "run_node"]

#: The most objects one message from the server may name (arrays and their chunks, many
#: times over for the largest shipped network); a tree naming more is refused unread.
MAX_MESSAGE_OBJECTS = 65536

logger = logging.getLogger("fedbn_med.node")

Report = Callable[[Event], object]


def _no_report(event: Event) -> None:
    return None


def _load_auth_keys(private_key: Path | None):
    if private_key is None:
        return None
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key

    if not private_key.is_file():
        raise FileNotFoundError(f"Site key {private_key} does not exist.")
    key = load_ssh_private_key(private_key.read_bytes(), password=None)
    return key, key.public_key()


def run_node(
    superlink: str,
    node: NodeSettings,
    *,
    root_certificates: Path | None = None,
    private_key: Path | None = None,
    insecure: bool = True,
    max_wait_time: float | None = 60.0,
    poll: float = 0.02,
    max_poll: float = 0.25,
    reconnect_timeout: float = 600.0,
    report: Report | None = None,
    console: SiteConsole | None = None,
    until_done: bool = False,
) -> None:
    """Serve the ClientApp for one site until the process is stopped (or the run ends).

    Parameters
    ----------
    superlink : str
        ``HOST:PORT`` of the SuperLink's Fleet API.
    node : NodeSettings
        The site this node serves, where it keeps its state, its data and device.
    root_certificates : path, optional
        The consortium CA certificate (TLS); required unless ``insecure``.
    private_key : path, optional
        The site's OpenSSH private key for SuperNode authentication.
    max_wait_time : float, optional
        Give up connecting after this many seconds (None: retry forever).
    reconnect_timeout : float
        After losing a server it had reached, keep trying this long before giving up.
    poll, max_poll : float
        Seconds between asks for a message that is due, and the longest pause once it is
        late, so idle sites do not load the SuperLink (see
        :class:`fedbn_med.federation.pacing.Pacer`).
    report : callable, optional
        Called with :class:`~fedbn_med.federation.events.NodeReady` once connected and
        :class:`~fedbn_med.federation.events.NodeLost` when the server goes away.
    console : SiteConsole, optional
        Told when the site joins and what left it with each reply (hospital mode).
    until_done : bool
        Return once the site has answered a federation's final evaluation (hospital
        mode); otherwise serve until stopped, federation after federation.

    Raises
    ------
    ConnectionError
        When the server cannot be reached within ``max_wait_time`` (or, once reached,
        not again within ``reconnect_timeout``).
    """
    from fedbn_med.federation.client_app import app as client_app  # heavy imports, once

    if not insecure and root_certificates is None:
        raise ValueError("TLS needs the consortium CA certificate (--root-certificates).")
    certs = root_certificates.read_bytes() if root_certificates is not None else None
    keys = _load_auth_keys(private_key)
    site = node.site
    policy = site_policy(site)  # read before connecting: a bad file is said at once
    node_config = node.to_node_config()
    report = report or _no_report
    connected_once = False
    while True:
        wait_time = max_wait_time if not connected_once else reconnect_timeout
        session, node_id = _open_session(superlink, site, insecure, certs, keys, wait_time,
                                         "reach" if not connected_once else "reconnect to")
        connected_once = True
        logger.info("Site %s connected to %s as node %s", site, superlink, node_id)
        report(NodeReady(site=site, node_id=node_id, pid=os.getpid()))
        if console is not None:
            console.joined(superlink, node_id)
        try:
            _serve(session, node_id, client_app, node_config, poll, max_poll, policy,
                   console, until_done)
        except httpx.HTTPError as err:
            # The server went away (crash, restart, network cut) or forgot this node: our
            # state is on disk and in memory; register again and carry on where the
            # federation is.
            logger.warning("Site %s lost the federation server (%s); reconnecting", site, err)
            report(NodeLost(site=site, reason=shorten(str(err)), pid=os.getpid()))
            if console is not None:
                console.lost(shorten(str(err)))
            _close_within(session, 5.0)
            time.sleep(1.0)
            continue
        except BaseException:
            # Stopping: leave the federation politely, but never hang on a server that is
            # gone (nor on a transfer still running in a worker thread).
            watchdog = threading.Timer(10.0, os._exit, (0,))
            watchdog.daemon = True
            watchdog.start()
            _close_within(session, 5.0)
            raise
        # _serve returned: the federation's final evaluation was answered (until_done)
        _close_within(session, 5.0)
        if console is not None:
            console.finished()
        return


def _open_session(superlink: str, site: str, insecure: bool, certs: bytes | None, keys,
                  wait_time: float | None, what: str) -> tuple[flwr_compat.FleetSession, int]:
    # A site restarted soon after it died finds the SuperLink still holding its earlier
    # node as online (until two heartbeats are missed, up to a minute): activate-node
    # answers 412 until then. Ask again until it lets us in, within our wait bound.
    started = time.monotonic()
    deadline = None if wait_time is None else started + wait_time
    while True:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.1)
        session = flwr_compat.FleetSession(superlink, insecure=insecure,
                                           root_certificates=certs,
                                           authentication_keys=keys, max_wait_time=left)
        try:
            return session, session.open()
        except ConnectionError as err:
            cause = err.__cause__
            held = isinstance(cause, httpx.HTTPStatusError) and \
                cause.response.status_code == 412
            now = time.monotonic()
            if held and (deadline is None or now < deadline):
                logger.info("Site %s: the server still holds this site's earlier connection; "
                            "asking again", site)
                time.sleep(2.0 if deadline is None else min(2.0, deadline - now))
                continue
            reason = ("the server would not activate this site's node (HTTP 412): it still "
                      "holds the site's earlier connection (a site restarted within a minute "
                      "of stopping waits for that to expire), or it does not know the "
                      "site's key") if held else str(err)
            bound = "with no time limit" if wait_time is None else f"within {wait_time:g} s"
            raise ConnectionError(
                f"Site '{site}' could not {what} the federation server at {superlink} "
                f"{bound} (it gave up after {time.monotonic() - started:.1f} s): {reason}"
            ) from err


def _close_within(session: flwr_compat.FleetSession, seconds: float) -> None:
    closer = threading.Thread(target=_close_quietly, args=(session,), daemon=True)
    closer.start()
    closer.join(timeout=seconds)


def _close_quietly(session: flwr_compat.FleetSession) -> None:
    try:
        session.close()
    except Exception:  # noqa: BLE001 - the server may be gone
        pass


def _serve(session: flwr_compat.FleetSession, node_id: int, client_app, node_config,
           poll: float, max_poll: float, policy: SitePolicy,
           console: SiteConsole | None = None, until_done: bool = False) -> None:
    contexts: dict[int, Context] = {}

    def pull(run_id: int, tree: object) -> Message:
        # what this site accepts of one message from the server: its own file decides
        return session.pull_message(run_id, tree, max_bytes=policy.max_message_bytes,
                                    max_objects=MAX_MESSAGE_OBJECTS,
                                    timeout=policy.message_timeout)

    # The next message comes about a round after this site's reply; wait through most of
    # that, then ask often (see fedbn_med.federation.pacing).
    pacer = Pacer(poll=poll, max_poll=max_poll)
    while True:
        asked_at = time.monotonic()
        try:
            received = session.receive()
        except flwr_compat.RunNotRunning:
            received = None
        if received is None:
            pacer.sleep()
            continue
        empty_polls = pacer.arrived(asked_at)
        head, tree = received
        t_received = time.monotonic()
        run_id = head.metadata.run_id
        try:
            if run_id not in contexts:
                try:
                    run_config = session.run_config(run_id)
                except (ValueError, flwr_compat.ContentsRefused) as err:
                    # a FAB over the site's bounds: refused unread, the node serves on
                    logger.warning("Site %s refused run %d's FAB: %s",
                                   node_config.get("site"), run_id, err)
                    session.push_reply(run_id, Message(Error(
                        code=flwr_compat.MESSAGE_REFUSED,
                        reason=f"site refused the run's FAB: {err}"), reply_to=head), 0.0)
                    pacer.start()
                    continue
                contexts.clear()
                # the app's hash as this node computed it: the site's approval pins it
                app_hash = session.fab_hashes.get(run_id, "")
                contexts[run_id] = Context(
                    run_id=run_id, node_id=node_id,
                    node_config={**node_config, APP_HASH_KEY: app_hash},
                    state=RecordDict(), run_config=run_config,
                )
            try:
                message = pull(run_id, tree)
            except flwr_compat.MessageRefused as err:
                # answered at once, so the server's round need not wait for its timeout
                logger.warning("Site %s refused a %s message from the server: %s",
                               node_config.get("site"), head.metadata.message_type, err)
                session.push_reply(run_id, Message(Error(
                    code=flwr_compat.MESSAGE_REFUSED,
                    reason=f"site refused the message: {err}"), reply_to=head), 0.0)
                pacer.start()
                continue
            started = time.monotonic()
            try:
                reply = client_app(message=message, context=contexts[run_id])
            except Exception as err:  # reported to the server, the node stays up
                logger.exception("Site %s failed on a %s message",
                                 node_config.get("site"), message.metadata.message_type)
                reply = Message(Error(code=flwr_compat.CLIENT_APP_RAISED,
                                      reason=f"{type(err).__name__}: {err}"),
                                reply_to=message)
            runtime = time.monotonic() - started
            session.push_reply(run_id, reply, runtime)
            pacer.start()
            if console is not None:
                console.answered(message, reply)
            if until_done and message.metadata.message_type.startswith(MessageType.EVALUATE):
                return  # the server evaluates once, after its last round
            logger.info("%s message: pulled in %.3f s, handled in %.3f s, replied in %.3f s "
                        "(%d empty polls before it)", message.metadata.message_type,
                        started - t_received, runtime, time.monotonic() - started - runtime,
                        empty_polls)
        except flwr_compat.RunNotRunning:
            contexts.pop(run_id, None)


def _stop(signum: int, frame: object) -> None:
    if _STOPPING.is_set():
        os._exit(128 + signum)
    _STOPPING.set()
    watchdog = threading.Timer(15.0, os._exit, (128 + signum,))
    watchdog.daemon = True
    watchdog.start()
    raise SystemExit(0 if signum == signal.SIGTERM else 130)


_STOPPING = threading.Event()


def main(argv: Sequence[str] | None = None) -> None:
    """Run a site node from the command line (used by the launcher)."""
    parser = argparse.ArgumentParser(description="fedbn-med site node (Flower Fleet API)")
    parser.add_argument("--superlink", required=True, help="HOST:PORT of the SuperLink")
    parser.add_argument("--node-settings", required=True,
                        help="the site's NodeSettings as JSON (see fedbn_med.federation.config)")
    parser.add_argument("--root-certificates", type=Path, default=None)
    parser.add_argument("--auth-key", type=Path, default=None)
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--max-wait-time", type=float, default=60.0)
    parser.add_argument("--events-fd", type=int, default=None,
                        help="write typed events (JSON lines) to this file descriptor")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    # SIGTERM and SIGINT leave the federation cleanly, in every state (connecting,
    # serving, reconnecting); a second signal, or a clean-up over 15 s, ends it at once.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    report: Report = _no_report
    if args.events_fd is not None:
        fd = args.events_fd
        report = lambda event: emit(fd, event)  # noqa: E731
    try:
        node = NodeSettings.from_node_config({RUN_CONFIG_KEY: args.node_settings})
        run_node(args.superlink, node,
                 root_certificates=args.root_certificates, private_key=args.auth_key,
                 insecure=args.insecure, max_wait_time=args.max_wait_time, report=report)
    except (ConnectionError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        site = json.loads(args.node_settings).get("site", "?") if args.node_settings else "?"
        report(NodeFailed(site=str(site), reason=shorten(str(err)),
                          pid=os.getpid()))
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
