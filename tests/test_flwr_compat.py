"""The contract with Flower's internals: every one that _flwr_compat relies on, checked.

A Flower upgrade that moves or changes one of them fails here, naming what changed,
instead of showing up as a hang in a federated run.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import time

import pytest

from fedbn_med.federation import _flwr_compat as compat
from tests.fresh import modules_after

DOOR = "fedbn_med/federation/_flwr_compat.py"

# module -> names it must hold
NAMES = {
    "flwr.app": ["Error", "Message", "Metadata"],
    "flwr.app.message": ["make_message", "remove_content_from_message"],
    "flwr.common.config": ["get_fused_config_from_fab"],
    "flwr.common.constant": ["HEARTBEAT_DEFAULT_INTERVAL", "MAX_RETRY_DELAY", "ErrorCode",
                             "FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE"],
    "flwr.common.serde": ["fab_from_proto", "message_from_proto", "message_to_proto",
                          "run_from_proto"],
    "flwr.proto.fab_pb2": ["GetFabRequest"],
    "flwr.proto.fleet_pb2": ["ActivateNodeRequest", "DeactivateNodeRequest",
                             "PullMessagesRequest", "PushMessagesRequest",
                             "RegisterNodeFleetRequest", "UnregisterNodeFleetRequest"],
    "flwr.proto.heartbeat_pb2": ["SendNodeHeartbeatRequest"],
    "flwr.proto.message_pb2": ["ConfirmMessageReceivedRequest"],
    "flwr.proto.node_pb2": ["Node"],
    "flwr.proto.run_pb2": ["GetRunRequest"],
    "flwr.proto.runtime_pb2": ["PullAppMessagesRequest"],
    "flwr.superlink.grid": ["HttpGrid"],
    "flwr.supercore.constant": ["SYSTEM_MESSAGE_TYPE"],
    "flwr.supercore.heartbeat": ["HeartbeatSender"],
    "flwr.supercore.inflatable.inflatable_object": [
        "get_all_nested_objects", "get_object_tree", "iterate_object_tree",
        "no_object_id_recompute"],
    "flwr.supercore.inflatable.inflatable_protobuf_utils": [
        "make_pull_object_fn_protobuf", "make_push_object_fn_protobuf"],
    "flwr.supercore.inflatable.inflatable_utils": [
        "ObjectPullError", "inflate_object_from_contents", "ObjectUnavailableError",
        "push_object_contents_from_iterable"],
    "flwr.supercore.interceptors.http.runtime_version": ["RuntimeVersionHttpInterceptor"],
    "flwr.supercore.primitives.asymmetric": ["generate_key_pairs", "public_key_to_bytes"],
    "flwr.supercore.retry.retry_invoker": ["RetryInvoker", "exponential"],
    "flwr.supercore.run": ["RunNotRunningException"],
    "flwr.supernode.fleet_http_client": ["FleetHttpClient"],
    "flwr.supernode.node_auth_http_interceptor": ["NodeAuthHttpInterceptor"],
}

# "module:qualified.name" -> parameters it must accept (by name, in any order)
SIGNATURES = {
    "flwr.supernode.fleet_http_client:FleetHttpClient.from_server_address":
        ["server_address", "insecure", "root_certificates", "interceptors"],
    "flwr.supercore.retry.retry_invoker:RetryInvoker.__init__":
        ["wait_gen_factory", "recoverable_exceptions", "max_tries", "max_time",
         "should_giveup"],
    "flwr.supercore.retry.retry_invoker:RetryInvoker.invoke": ["target"],
    "flwr.supercore.retry.retry_invoker:exponential": ["max_delay"],
    "flwr.supercore.heartbeat:HeartbeatSender.__init__": ["heartbeat_fn"],
    "flwr.supercore.inflatable.inflatable_utils:push_object_contents_from_iterable":
        ["object_contents", "push_object_fn"],
    "flwr.supercore.inflatable.inflatable_utils:inflate_object_from_contents":
        ["object_id", "object_contents"],
    "flwr.supercore.inflatable.inflatable_protobuf_utils:make_pull_object_fn_protobuf":
        ["pull_object_protobuf", "node", "run_id"],
    "flwr.supercore.inflatable.inflatable_protobuf_utils:make_push_object_fn_protobuf":
        ["push_object_protobuf", "node", "run_id", "session_id"],
    "flwr.common.config:get_fused_config_from_fab": ["fab_file", "run"],
    "flwr.supernode.node_auth_http_interceptor:NodeAuthHttpInterceptor.__init__":
        ["private_key", "public_key"],
    "flwr.supercore.interceptors.http.runtime_version:RuntimeVersionHttpInterceptor.__init__":
        ["component_name"],
    "flwr.app.message:make_message": ["metadata", "error"],
    "flwr.app:Metadata.__init__":
        ["run_id", "message_id", "src_node_id", "dst_node_id", "message_type", "group_id",
         "ttl", "reply_to_message_id", "created_at"],
}

FLEET_METHODS = ["RegisterNode", "ActivateNode", "DeactivateNode", "UnregisterNode",
                 "SendNodeHeartbeat", "PullMessages", "PushMessages", "GetRun", "GetFab",
                 "PullObject", "PushObject", "ConfirmMessageReceived", "close"]

# protobuf message -> fields it must have
FIELDS = {
    "flwr.proto.fleet_pb2:ActivateNodeRequest": ["public_key", "heartbeat_interval"],
    "flwr.proto.fleet_pb2:ActivateNodeResponse": ["node_id"],
    "flwr.proto.fleet_pb2:RegisterNodeFleetRequest": ["public_key"],
    "flwr.proto.fleet_pb2:DeactivateNodeRequest": ["node_id"],
    "flwr.proto.fleet_pb2:UnregisterNodeFleetRequest": ["node_id"],
    "flwr.proto.fleet_pb2:PullMessagesRequest": ["node"],
    "flwr.proto.fleet_pb2:PullMessagesResponse": ["messages_list", "message_object_trees"],
    "flwr.proto.fleet_pb2:PushMessagesRequest":
        ["node", "messages_list", "message_object_trees", "clientapp_runtime_list"],
    "flwr.proto.fleet_pb2:PushMessagesResponse": ["objects_to_push", "session_id"],
    "flwr.proto.heartbeat_pb2:SendNodeHeartbeatRequest": ["node", "heartbeat_interval"],
    "flwr.proto.heartbeat_pb2:SendNodeHeartbeatResponse": ["success"],
    "flwr.proto.run_pb2:GetRunRequest": ["node", "run_id"],
    "flwr.proto.run_pb2:GetRunResponse": ["run"],
    "flwr.proto.fab_pb2:GetFabRequest": ["node", "hash_str", "run_id"],
    "flwr.proto.fab_pb2:GetFabResponse": ["fab"],
    "flwr.proto.message_pb2:ConfirmMessageReceivedRequest":
        ["node", "run_id", "message_object_id"],
    "flwr.proto.message_pb2:ObjectTree": ["object_id"],
    "flwr.proto.runtime_pb2:PullAppMessagesRequest": ["message_ids"],
    "flwr.proto.runtime_pb2:PullAppMessagesResponse": ["messages_list", "message_object_trees"],
}


def _resolve(path: str):
    module_name, _, qualname = path.partition(":")
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def test_installed_flwr_is_the_pinned_version():
    installed = importlib.metadata.version("flwr")
    assert installed == compat.FLWR_VERSION, (
        f"flwr {installed} is installed; {DOOR} was written for {compat.FLWR_VERSION}.")


@pytest.mark.parametrize("module_name", sorted(NAMES))
def test_internal_modules_hold_the_names_we_use(module_name):
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        pytest.fail(f"flwr module {module_name} is gone ({err}); {DOOR} imports from it.")
    missing = [n for n in NAMES[module_name] if not hasattr(module, n)]
    assert not missing, f"{module_name} no longer has {missing}; {DOOR} uses them."


@pytest.mark.parametrize("path", sorted(SIGNATURES))
def test_internal_functions_take_the_parameters_we_pass(path):
    params = set(inspect.signature(_resolve(path)).parameters)
    missing = [p for p in SIGNATURES[path] if p not in params]
    assert not missing, (f"{path} no longer takes {missing} (it takes {sorted(params)}); "
                         f"{DOOR} passes them.")


def test_fleet_client_has_every_call_we_make():
    client = _resolve("flwr.supernode.fleet_http_client:FleetHttpClient")
    missing = [m for m in FLEET_METHODS if not callable(getattr(client, m, None))]
    assert not missing, f"FleetHttpClient no longer has {missing}; {DOOR} calls them."


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_protocol_messages_have_the_fields_we_read(path):
    fields = set(_resolve(path).DESCRIPTOR.fields_by_name)
    missing = [f for f in FIELDS[path] if f not in fields]
    assert not missing, f"{path} no longer has fields {missing}; {DOOR} uses them."


def test_error_codes_we_send_exist():
    codes = _resolve("flwr.common.constant:ErrorCode")
    for name in ("CLIENT_APP_RAISED_EXCEPTION", "MESSAGE_UNAVAILABLE"):
        assert isinstance(getattr(codes, name, None), int), f"ErrorCode.{name} is gone."


def test_http_grid_exposes_its_connection_node_and_run():
    # pull_replies works on the grid's own connection: these attributes must exist.
    grid_cls = _resolve("flwr.superlink.grid:HttpGrid")
    assert isinstance(inspect.getattr_static(grid_cls, "_runtime_client"), property), \
        f"HttpGrid._runtime_client is no longer a property; {DOOR}.pull_replies uses it."
    assert isinstance(inspect.getattr_static(grid_cls, "run"), property), "HttpGrid.run is gone."
    grid = grid_cls(token="contract-test")  # connects lazily: nothing is dialled here
    assert hasattr(grid.node, "node_id"), "HttpGrid.node (with node_id) is gone."


def test_message_id_lives_where_we_write_it():
    from flwr.app import Metadata, RecordDict
    from flwr.app.message import make_message

    metadata = Metadata(run_id=1, message_id="", src_node_id=0, dst_node_id=1,
                        message_type="train", group_id="", ttl=60.0, reply_to_message_id="",
                        created_at=time.time())
    message = make_message(metadata=metadata, content=RecordDict())
    assert "_message_id" in message.metadata.__dict__, (
        "Metadata no longer keeps its ID in __dict__['_message_id']; "
        f"{DOOR}.set_message_id writes it there.")
    compat.set_message_id(message, "abc")
    assert message.metadata.message_id == "abc"


def test_superlink_command_is_declared():
    from fedbn_med.federation.launcher.flower_cli import superlink_entry_point

    module, _, name = superlink_entry_point().partition(":")
    assert callable(getattr(importlib.import_module(module), name))


def test_another_flwr_version_is_refused_clearly(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.9.9")
    monkeypatch.delenv("FEDBN_MED_ANY_FLWR", raising=False)
    with pytest.raises(ImportError, match=r"needs flwr==1\.42\.0 .* but flwr 9\.9\.9 is "
                                          r"installed"):
        compat.check_flwr_version()
    monkeypatch.setenv("FEDBN_MED_ANY_FLWR", "1")
    with pytest.warns(RuntimeWarning, match="Going on because FEDBN_MED_ANY_FLWR=1"):
        compat.check_flwr_version()


def test_a_session_with_no_server_fails_with_a_connection_error():
    from fedbn_med.federation.launcher import free_port

    session = compat.FleetSession(f"127.0.0.1:{free_port()}", insecure=True, max_wait_time=1.0)
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="did not accept this node"):
        session.open()
    assert time.monotonic() - started < 30


def test_no_flwr_internals_outside_the_door():
    # Public flwr surface only, everywhere but _flwr_compat.
    import pathlib
    import re

    public = re.compile(r"^\s*(from|import) flwr(\.(app|clientapp|serverapp|common))?(\s|$|\.)")
    root = pathlib.Path(compat.__file__).resolve().parents[1]
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "_flwr_compat.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"^\s*(from|import) flwr\b", line) and not public.match(line):
                offenders.append(f"{path.relative_to(root.parent)}:{number}: {line.strip()}")
            if re.match(r"^\s*from flwr\.common\.\w+ import", line):
                offenders.append(f"{path.relative_to(root.parent)}:{number}: {line.strip()}")
    assert not offenders, "flwr internals used outside " + DOOR + ":\n" + "\n".join(offenders)


def test_reply_bounds_cover_a_scaffold_reply_and_no_more():
    from fedbn_med.federation._flwr_replies import reply_bounds

    chunk = _resolve("flwr.common.constant:FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE")
    max_bytes, max_objects = reply_bounds([400, 3 * chunk + 1])
    assert max_bytes == 2 * (400 + 3 * chunk + 1) + (1 << 20)
    # weights and controls: (1 + 1 chunk) + (1 + 4 chunks), twice, and the records' 256
    assert max_objects == 2 * (2 + 5) + 256


def test_a_site_process_loads_none_of_the_superlinks_state():
    # the server's HttpGrid comes through the door on first use: its package loads the
    # SuperLink's in-memory state, which a site's process never needs
    assert modules_after("import fedbn_med.federation.node", [
        "flwr.superlink.grid", "flwr.server.superlink.linkstate"]) == []
    from fedbn_med.federation._flwr_compat import HttpGrid

    assert HttpGrid.__module__.startswith("flwr.superlink.grid"), HttpGrid
