"""A long-lived site node: one process per site, speaking Flower's Fleet API.

``flower-supernode`` in flwr 1.42 starts a fresh ClientApp process for every message,
which re-imports torch and MONAI and reloads the site's data each time (seconds per
message), and it polls with fixed 3 s / 0.5 s sleeps. This node registers with the
SuperLink exactly as a SuperNode does (same Fleet API, same heartbeats, TLS and node
authentication), but runs the ClientApp inside its own process: imports, data loading
and model set-up happen once per site, and the private state stays in memory between
rounds (and on disk after each round).

It uses flwr internals (``flwr.supernode.fleet_http_connection``), hence flwr==1.42.0.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
from flwr.app import Context, Error, Message, RecordDict
from flwr.common.config import get_fused_config_from_fab
from flwr.common.constant import ErrorCode
from flwr.supercore.inflatable.inflatable_object import (
    get_all_nested_objects,
    get_object_tree,
    no_object_id_recompute,
)
from flwr.supercore.inflatable.inflatable_utils import (
    pull_and_inflate_object_from_tree,
    push_object_contents_from_iterable,
)
from flwr.supercore.run import RunNotRunningException
from flwr.supernode import fleet_http_connection
from flwr.supernode.fleet_http_connection import http_request_response

from fedbn_med.federation.pacing import Pacer

__all__ = ["main", "run_node"]

logger = logging.getLogger("fedbn_med.node")


class _ConnectFailed(ConnectionError):
    pass


class _ServerForgotUs(BaseException):
    """The SuperLink answered 401: it restarted and no longer knows this node."""


_LAST_401 = [0.0]
_httpx_send = httpx.Client.send


def _send_noting_401(self: httpx.Client, request: httpx.Request, **kwargs: object
                     ) -> httpx.Response:
    response = _httpx_send(self, request, **kwargs)  # type: ignore[arg-type]
    if response.status_code == 401:
        _LAST_401[0] = time.monotonic()
    return response


def _on_sigint(signum: int, frame: object) -> None:
    # flwr answers a 401 (a restarted SuperLink that forgot this node) by sending SIGINT
    # to its own process. That means "register again", not "stop": only a SIGINT with no
    # 401 just before it stops the site.
    if time.monotonic() - _LAST_401[0] < 10.0:
        raise _ServerForgotUs
    raise KeyboardInterrupt


def _raise_instead_of_exit(code: object, message: str | None = None, *_: object,
                           **__: object) -> None:
    # flwr ends the whole process (os._exit from a timer thread) when a SuperNode cannot
    # connect; a site process, or a test calling run_site, should get an error instead.
    raise _ConnectFailed(message or str(code))


fleet_http_connection.flwr_exit = _raise_instead_of_exit  # type: ignore[assignment]


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
    node_config: dict[str, object],
    *,
    root_certificates: Path | None = None,
    private_key: Path | None = None,
    insecure: bool = True,
    max_wait_time: float | None = 60.0,
    poll: float = 0.02,
    max_poll: float = 0.25,
    reconnect_timeout: float = 600.0,
) -> None:
    """Serve the ClientApp for one site until the process is stopped.

    Parameters
    ----------
    superlink : str
        ``HOST:PORT`` of the SuperLink's Fleet API.
    node_config : dict
        The node config (``site``, ``data-dir``, ``device``, ``state-dir``).
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
    """
    from fedbn_med.federation.client_app import app as client_app  # heavy imports, once

    if not insecure and root_certificates is None:
        raise ValueError("TLS needs the consortium CA certificate (--root-certificates).")
    certs = root_certificates.read_bytes() if root_certificates is not None else None
    keys = _load_auth_keys(private_key)
    site = node_config.get("site")
    previous = signal.getsignal(signal.SIGINT)
    httpx.Client.send = _send_noting_401  # type: ignore[method-assign]
    try:
        _connect_and_serve(superlink, node_config, certs, keys, insecure, max_wait_time,
                           reconnect_timeout, client_app, poll, max_poll, site)
    finally:
        signal.signal(signal.SIGINT, previous)
        httpx.Client.send = _httpx_send  # type: ignore[method-assign]


def _connect_and_serve(superlink, node_config, certs, keys, insecure, max_wait_time,
                       reconnect_timeout, client_app, poll, max_poll, site) -> None:
    connected_once = False
    while True:
        wait_time = max_wait_time if not connected_once else reconnect_timeout
        try:
            connection = http_request_response(
                superlink, insecure=insecure, root_certificates=certs,
                authentication_keys=keys, max_wait_time=wait_time,
            )
            conn = connection.__enter__()
        except (Exception, SystemExit) as err:
            what = "reach" if not connected_once else "reconnect to"
            raise ConnectionError(
                f"Site '{site}' could not {what} the federation server at {superlink} "
                f"within {wait_time} s: {err}"
            ) from err
        connected_once = True
        signal.signal(signal.SIGINT, _on_sigint)
        try:
            _serve(conn, client_app, node_config, superlink, poll, max_poll)
        except (httpx.HTTPError, _ServerForgotUs) as err:
            # The server went away (crash, restart, network cut): our state is on disk and
            # in memory; register again and carry on where the federation is.
            logger.warning("Site %s lost the federation server (%s); reconnecting", site, err)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # flwr's 401 signals while closing
            closer = threading.Thread(target=_close_quietly, args=(connection,), daemon=True)
            closer.start()
            closer.join(timeout=5.0)
            time.sleep(1.0)
        except BaseException:
            # Stopping: leave the federation politely, but never hang on a server that is
            # gone.
            watchdog = threading.Timer(5.0, os._exit, (0,))
            watchdog.daemon = True
            watchdog.start()
            _close_quietly(connection)
            raise


def _close_quietly(connection) -> None:
    try:
        connection.__exit__(None, None, None)
    except (Exception, SystemExit):  # noqa: BLE001 - the server may be gone
        pass


def _serve(conn, client_app, node_config, superlink, poll, max_poll) -> None:
    contexts: dict[int, Context] = {}
    node_id, receive, send, get_run, get_fab, pull_obj, push_obj, confirm = conn
    logger.info("Site %s connected to %s as node %s", node_config.get("site"), superlink,
                node_id)
    print(f"fedbn-med node ready: site={node_config.get('site')} node_id={node_id}",
          flush=True)
    # The next message comes about a round after this site's reply; wait through most of
    # that, then ask often (see fedbn_med.federation.pacing).
    pacer = Pacer(poll=poll, max_poll=max_poll)
    while True:
        asked_at = time.monotonic()
        try:
            received = receive()
        except RunNotRunningException:
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
                run = get_run(run_id)
                fab = get_fab(run.fab_hash, run_id)
                contexts.clear()
                contexts[run_id] = Context(
                    run_id=run_id, node_id=node_id, node_config=node_config,
                    state=RecordDict(),
                    run_config=get_fused_config_from_fab(fab.content, run),
                )
            message = pull_and_inflate_object_from_tree(
                tree, lambda oid: pull_obj(run_id, oid), lambda oid: confirm(run_id, oid),
                return_type=Message, initial_backoff=0.01, backoff_cap=0.2,
            )
            message.metadata.__dict__["_message_id"] = tree.object_id
            started = time.monotonic()
            try:
                reply = client_app(message=message, context=contexts[run_id])
            except Exception as err:  # reported to the server, the node stays up
                logger.exception("Site %s failed on a %s message",
                                 node_config.get("site"), message.metadata.message_type)
                reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                      reason=f"{type(err).__name__}: {err}"),
                                reply_to=message)
            runtime = time.monotonic() - started
            with no_object_id_recompute():
                reply.metadata.__dict__["_message_id"] = reply.object_id
                objects = get_all_nested_objects(reply)
                wanted, session = send(reply, get_object_tree(reply), runtime)
                push_object_contents_from_iterable(
                    ((oid, obj.deflate()) for oid, obj in objects.items() if oid in wanted),
                    lambda oid, content: push_obj(run_id, session, oid, content),
                )
            pacer.start()
            logger.info("%s message: pulled in %.3f s, handled in %.3f s, replied in %.3f s "
                        "(%d empty polls before it)", message.metadata.message_type,
                        started - t_received, runtime, time.monotonic() - started - runtime,
                        empty_polls)
        except RunNotRunningException:
            contexts.pop(run_id, None)


def parse_node_config(text: str) -> dict[str, object]:
    """Parse ``key='value' key2=3`` the way Flower's ``--node-config`` does."""
    from flwr.common.config import parse_config_args

    return dict(parse_config_args([text])) if text else {}


def main(argv: Sequence[str] | None = None) -> None:
    """Run a site node from the command line (used by the launcher)."""
    parser = argparse.ArgumentParser(description="fedbn-med site node (Flower Fleet API)")
    parser.add_argument("--superlink", required=True, help="HOST:PORT of the SuperLink")
    parser.add_argument("--node-config", default="", help="e.g. \"site='UCLA' state-dir='/x'\"")
    parser.add_argument("--root-certificates", type=Path, default=None)
    parser.add_argument("--auth-key", type=Path, default=None)
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--max-wait-time", type=float, default=60.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # leave the federation cleanly
    try:
        run_node(args.superlink, parse_node_config(args.node_config),
                 root_certificates=args.root_certificates, private_key=args.auth_key,
                 insecure=args.insecure, max_wait_time=args.max_wait_time)
    except (ConnectionError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
