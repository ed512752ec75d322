"""The one door to Flower's internals: everything fedbn-med uses that flwr does not publish.

Flower's public surface (``flwr.app``, ``flwr.clientapp``, ``flwr.serverapp``, the
``flwr`` and ``flower-*`` commands) cannot run a ClientApp inside a long-lived process of
our own, nor pull messages with a shorter back-off and bounds of our own (see
:mod:`fedbn_med.federation.node` and :class:`fedbn_med.federation.server_app.FastGrid`),
so this module imports flwr internals, and only this module does:

- :class:`FleetSession`: a site node's own connection to the SuperLink's Fleet API, from
  flwr's ``FleetHttpClient``, interceptors, retries, heartbeat, protobuf messages and
  (de)inflation helpers. It never ends or signals the process, and tells a forgotten
  node (HTTP 401) by a flag of its own.
- :func:`pull_available`, which both sides pull a message's contents with; the server's
  side, :mod:`._flwr_replies`, uses the internals imported here (``HttpGrid`` on first
  use) and nowhere else.
- :func:`fused_run_config`, :data:`CLIENT_APP_RAISED`, :data:`RunNotRunning`,
  :func:`set_message_id`. The installed flwr must be :data:`FLWR_VERSION`;
  ``tests/test_flwr_compat.py`` checks every internal named here and says what changed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import httpx

from fedbn_med.federation._bounded_http import (
    ContentsRefused,
    ContentsTooLarge,
    cap_fab_pulls,
    cap_object_pulls,
)
from fedbn_med.federation._flwr_version import FLWR_VERSION, check_flwr_version
from fedbn_med.federation.fab import check_fab

__all__ = [
    "CLIENT_APP_RAISED", "FLWR_VERSION", "MESSAGE_REFUSED", "ContentsRefused", "ContentsTooLarge",
    "FleetSession", "MessageRefused", "NodeForgotten", "RunNotRunning", "fused_run_config",
    "pull_available", "set_message_id",
    # flwr internals passed on to the server's side of the door, _flwr_replies
    "FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE", "SYSTEM_MESSAGE_TYPE", "ConfirmMessageReceivedRequest",
    "Error", "ErrorCode", "Message", "Metadata", "ObjectPullError",  # and HttpGrid, on use
    "PullAppMessagesRequest", "inflate_object_from_contents", "iterate_object_tree",
    "make_message", "make_pull_object_fn_protobuf",
]

MAX_PULLS = 8  #: the most objects of one message pulled at once (its size checked after)


check_flwr_version()

try:  # every internal in one place: a missing one names itself here, at import
    from flwr.app import Error, Message, Metadata
    from flwr.app.message import make_message, remove_content_from_message
    from flwr.common.config import get_fused_config_from_fab
    from flwr.common.constant import (
        FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE,
        HEARTBEAT_DEFAULT_INTERVAL,
        MAX_RETRY_DELAY,
        ErrorCode,
    )
    from flwr.common.serde import (
        fab_from_proto,
        message_from_proto,
        message_to_proto,
        run_from_proto,
    )
    from flwr.proto.fab_pb2 import GetFabRequest  # pylint: disable=E0611
    from flwr.proto.fleet_pb2 import (  # pylint: disable=E0611
        ActivateNodeRequest,
        DeactivateNodeRequest,
        PullMessagesRequest,
        PushMessagesRequest,
        RegisterNodeFleetRequest,
        UnregisterNodeFleetRequest,
    )
    from flwr.proto.heartbeat_pb2 import SendNodeHeartbeatRequest  # pylint: disable=E0611
    from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest  # pylint: disable=E0611
    from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
    from flwr.proto.run_pb2 import GetRunRequest  # pylint: disable=E0611
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest  # pylint: disable=E0611
    from flwr.supercore.constant import SYSTEM_MESSAGE_TYPE
    from flwr.supercore.heartbeat import HeartbeatSender
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
        iterate_object_tree,
        no_object_id_recompute,
    )
    from flwr.supercore.inflatable.inflatable_protobuf_utils import (
        make_pull_object_fn_protobuf,
        make_push_object_fn_protobuf,
    )
    from flwr.supercore.inflatable.inflatable_utils import (
        ObjectPullError,
        ObjectUnavailableError,
        inflate_object_from_contents,
        push_object_contents_from_iterable,
    )
    from flwr.supercore.interceptors.http.runtime_version import (
        RuntimeVersionHttpInterceptor,
    )
    from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes
    from flwr.supercore.retry.retry_invoker import RetryInvoker, exponential
    from flwr.supercore.run import RunNotRunningException
    from flwr.supernode.fleet_http_client import FleetHttpClient
    from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor
except ImportError as err:  # pragma: no cover - only with another flwr
    raise ImportError(f"flwr {importlib.metadata.version('flwr')} lacks an internal that "
                      f"fedbn-med relies on ({err}); {__name__} needs updating for it.") from err


def __getattr__(name: str) -> Any:
    """Import ``HttpGrid`` on first use: its package loads SuperLink state no site needs."""
    if name != "HttpGrid":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from flwr.superlink.grid import HttpGrid  # resolved by tests/test_flwr_compat.py
    globals()["HttpGrid"] = HttpGrid
    return HttpGrid


# A Fleet call's error for an ended run (HTTP 403); a reply's codes: app raised, refused.
RunNotRunning = RunNotRunningException
CLIENT_APP_RAISED: int = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
MESSAGE_REFUSED: int = ErrorCode.MESSAGE_UNAVAILABLE

# Transient failures a call retries until its deadline (the set flwr retries).
_RETRY_STATUS = frozenset({502, 503, 504})
_RETRY_ERRORS: tuple[type[Exception], ...] = (
    httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError,
    httpx.ConnectTimeout, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout,
    httpx.HTTPStatusError)


class MessageRefused(Exception):
    """A message from the server that this site will not read (too large, incomplete)."""


def pull_available(pull: Callable[[str], bytes], object_ids: list[str],
                   contents: dict[str, bytes], max_bytes: int | None = None) -> bool:
    """Pull into ``contents`` what has come of ``object_ids``; return whether all are in.

    :data:`MAX_PULLS` at a time, raising :class:`ContentsTooLarge` after any few that
    take ``contents`` past ``max_bytes``; one not uploaded yet waits for a later call.
    Both sides pull so (:mod:`._flwr_replies`, :meth:`FleetSession.pull_message`).
    """
    def fetch(object_id: str) -> bytes | None:
        try:
            return pull(object_id)
        except ObjectUnavailableError:
            return None

    missing = [i for i in object_ids if i not in contents]
    size = sum(map(len, contents.values()))
    with ThreadPoolExecutor(MAX_PULLS) as pool:
        for start in range(0, len(missing), MAX_PULLS):
            batch = missing[start:start + MAX_PULLS]
            got = {i: d for i, d in zip(batch, pool.map(fetch, batch)) if d is not None}
            contents.update(got)
            size += sum(map(len, got.values()))
            if max_bytes is not None and size > max_bytes:
                raise ContentsTooLarge(f"its contents exceed the {max_bytes} bytes")
    return all(i in contents for i in object_ids)


class NodeForgotten(httpx.HTTPError):
    """The SuperLink answered 401: it restarted and no longer knows this node."""


def set_message_id(message: Message, object_id: str) -> None:
    """Give a message the ID the SuperLink knows it by (as flwr's own runtimes do)."""
    message.metadata.__dict__["_message_id"] = object_id


def fused_run_config(fab_content: bytes, run: Any) -> dict[str, Any]:
    """Return the run config of ``run``: the app's defaults with the run's overrides.

    The FAB is checked first (:func:`~fedbn_med.federation.fab.check_fab`): one that
    would inflate beyond the site's bounds is refused unread.
    """
    check_fab(fab_content)
    return dict(get_fused_config_from_fab(fab_content, run))


class FleetSession:
    """One registration of this site node with a SuperLink, over the Fleet API.

    What ``flower-supernode`` does through ``http_request_response``, with our own
    objects: its retries never signal or end the process, a 401 (a restarted SuperLink
    that forgot this node) raises :class:`NodeForgotten` in the next call, and a
    connection that cannot be made ``ConnectionError``.

    Parameters
    ----------
    server_address : str
        ``HOST:PORT`` of the Fleet API.
    insecure : bool
        Plain HTTP; otherwise TLS with ``root_certificates``.
    root_certificates : bytes, optional
        PEM of the CA the server's certificate must chain to.
    authentication_keys : tuple, optional
        The site's private and public EC key; without them it registers a fresh pair.
    max_wait_time : float, optional
        How long each call keeps retrying transient failures (None: forever).
    """

    def __init__(self, server_address: str, *, insecure: bool,
                 root_certificates: bytes | None = None,
                 authentication_keys: tuple[Any, Any] | None = None,
                 max_wait_time: float | None = None) -> None:
        self.self_registered = authentication_keys is None
        private_key, public_key = authentication_keys or generate_key_pairs()
        self._public_key = public_key_to_bytes(public_key)
        self._forgotten = threading.Event()
        #: run ID -> the SHA-256 of its FAB as this node received it (computed here, not
        #: taken from the server's word)
        self.fab_hashes: dict[int, str] = {}
        self._invoker = RetryInvoker(
            lambda: exponential(max_delay=MAX_RETRY_DELAY), _RETRY_ERRORS, max_tries=None,
            max_time=max_wait_time, should_giveup=self._should_giveup)
        self._client = FleetHttpClient.from_server_address(
            server_address, insecure, root_certificates,
            interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperNode"),
                          NodeAuthHttpInterceptor(private_key, public_key)])
        self._heartbeat = HeartbeatSender(self._send_heartbeat)
        self.node: Node | None = None

    # -- connection ------------------------------------------------------------------------
    def open(self) -> int:
        """Register and activate this node; return its node ID.

        Raises
        ------
        ConnectionError
            When the SuperLink cannot be reached, refuses this node, or its certificate is
            not trusted, within the session's wait time.
        """
        try:
            if self.self_registered:
                self._call(self._client.RegisterNode,
                           RegisterNodeFleetRequest(public_key=self._public_key))
            response = self._call(self._client.ActivateNode, ActivateNodeRequest(
                public_key=self._public_key, heartbeat_interval=HEARTBEAT_DEFAULT_INTERVAL))
        except Exception as err:  # noqa: BLE001 - every cause is a failure to connect
            self._client.close()
            raise ConnectionError(f"the SuperLink did not accept this node: {err}") from err
        self.node = Node(node_id=response.node_id)
        self._heartbeat.start()
        return int(self.node.node_id)

    def _registered(self) -> Node:
        """Return this node's identity, or say that it has not joined yet."""
        if self.node is None:
            raise ConnectionError("this node has not joined the federation yet (connect first)")
        return self.node

    def close(self) -> None:
        """Leave the federation (deactivate, unregister) and close the connection."""
        if self._heartbeat.is_running:
            self._heartbeat.stop()
        if self.node is not None:
            for call, request in (
                    (self._client.DeactivateNode, DeactivateNodeRequest(node_id=self.node.node_id)),
                    (self._client.UnregisterNode,
                     UnregisterNodeFleetRequest(node_id=self.node.node_id))):
                if call is self._client.UnregisterNode and not self.self_registered:
                    continue
                try:
                    call(request)
                except (httpx.HTTPError, RuntimeError):
                    pass  # the server may be gone
            self.node = None
        self._client.close()

    @property
    def forgotten(self) -> bool:
        """Return whether the SuperLink said it does not know this node (HTTP 401)."""
        return self._forgotten.is_set()

    def _should_giveup(self, exc: Exception) -> bool:
        if isinstance(exc, httpx.HTTPStatusError):
            code = exc.response.status_code
            if code == 401:
                self._forgotten.set()
            return code not in _RETRY_STATUS
        text = str(exc).lower()
        return any(term in text for term in ("certificate", "ssl", "tls"))

    def _call(self, method: Callable[[Any], Any], request: Any) -> Any:
        if self._forgotten.is_set():
            raise NodeForgotten("The SuperLink no longer knows this node (it restarted).")
        try:
            return self._invoker.invoke(method, request)
        except httpx.HTTPStatusError as err:
            if err.response.status_code == 401:
                raise NodeForgotten(f"The SuperLink no longer knows this node: {err}") from err
            if err.response.status_code == 403:
                raise RunNotRunningException from err
            raise

    def _send_heartbeat(self) -> bool:
        if self.node is None:
            return False
        try:
            response = self._client.SendNodeHeartbeat(SendNodeHeartbeatRequest(
                node=self.node, heartbeat_interval=HEARTBEAT_DEFAULT_INTERVAL))
        except httpx.TransportError:
            return False
        except httpx.HTTPStatusError as err:
            if err.response.status_code == 401:
                self._forgotten.set()
                return True  # nothing to retry: the serving loop reconnects
            return False
        return bool(response.success)

    # -- messages --------------------------------------------------------------------------
    def receive(self) -> tuple[Message, Any] | None:
        """Return the next message's head and object tree, or None when there is none."""
        assert self.node is not None, "open() the session first"
        response = self._call(self._client.PullMessages, PullMessagesRequest(node=self.node))
        if not response.messages_list:
            return None
        return message_from_proto(response.messages_list[0]), response.message_object_trees[0]

    def run_config(self, run_id: int) -> dict[str, Any]:
        """Return the fused run config of a run (its app's defaults plus overrides)."""
        run = run_from_proto(self._call(self._client.GetRun,
                                        GetRunRequest(node=self.node, run_id=run_id)).run)
        cap_fab_pulls(self._client._client)  # noqa: SLF001 - the FAB bounded as it arrives
        fab = fab_from_proto(self._call(self._client.GetFab, GetFabRequest(
            node=self.node, hash_str=run.fab_hash, run_id=run_id)).fab)
        config = fused_run_config(fab.content, run)
        self.fab_hashes[run_id] = hashlib.sha256(fab.content).hexdigest()
        return config

    def pull_message(self, run_id: int, tree: Any, *, max_bytes: int, max_objects: int,
                     timeout: float) -> Message:
        """Download a received message's contents, bounded; return the whole message.

        Raises :class:`MessageRefused` saying why (the node replies so and serves on): a
        tree of over ``max_objects`` objects before a byte is pulled, contents over
        ``max_bytes`` as soon as they are, or not all in within ``timeout`` seconds.
        """
        node = self._registered()
        try:
            ids = list(dict.fromkeys(t.object_id for t in iterate_object_tree(tree)))
        except RecursionError:
            raise MessageRefused("its object tree is nested too deeply") from None
        if len(ids) > max_objects:
            raise MessageRefused(f"it names {len(ids)} objects, more than the {max_objects} "
                                 "this site accepts in one message")
        cap_object_pulls(self._client._client, max_bytes)  # noqa: SLF001 - one object's bytes
        pull = make_pull_object_fn_protobuf(
            lambda request: self._call(self._client.PullObject, request), node, run_id)
        contents: dict[str, bytes] = {}
        deadline, delay = time.monotonic() + timeout, 0.01
        while True:
            try:
                if pull_available(pull, ids, contents, max_bytes):
                    break
            except ContentsRefused as err:
                bound = " this site accepts in one message" * isinstance(err, ContentsTooLarge)
                raise MessageRefused(f"{err}{bound}") from None
            if time.monotonic() >= deadline:
                raise MessageRefused(f"its contents did not all arrive within {timeout:g} s "
                                     f"({len(contents)} of {len(ids)} objects)")
            time.sleep(delay)
            delay = min(2 * delay, 0.2)
        try:
            message = cast(Message, inflate_object_from_contents(tree.object_id, contents))
        except Exception as err:  # noqa: BLE001 - whatever the server sent, a refusal
            raise MessageRefused(f"its contents do not form a message ({err})") from None
        self._call(self._client.ConfirmMessageReceived, ConfirmMessageReceivedRequest(
            node=node, run_id=run_id, message_object_id=tree.object_id))
        set_message_id(message, tree.object_id)
        return message

    def push_reply(self, run_id: int, reply: Message, runtime: float) -> None:
        """Send a reply: its head first, then the objects the SuperLink asks for."""
        with no_object_id_recompute():
            set_message_id(reply, reply.object_id)
            objects = get_all_nested_objects(reply)
            head = remove_content_from_message(reply) if reply.has_content() else reply
            response = self._call(self._client.PushMessages, PushMessagesRequest(
                node=self.node, messages_list=[message_to_proto(head)],
                message_object_trees=[get_object_tree(reply)],
                clientapp_runtime_list=[runtime]))
            wanted, session = set(response.objects_to_push), response.session_id
            push = make_push_object_fn_protobuf(
                lambda request: self._call(self._client.PushObject, request),
                self._registered(), run_id, session)
            push_object_contents_from_iterable(
                ((oid, obj.deflate()) for oid, obj in objects.items() if oid in wanted), push)

