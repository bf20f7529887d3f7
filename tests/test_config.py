"""The node config model: TOML file + ``RUNNEL_*`` environment, typed and validated at start.

Each rule is checked through ``load_config`` as a node would see it: a base configuration (a
valid combined controller + broker) is written as TOML with one change, or overridden by one
variable, and the ConfigError must name the exact key and where its value came from.
"""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from raft.core import RaftConfig
from raft.transport import TransportConfig
from runnel.config import (
    BrokerConfig,
    ConfigError,
    ControllerConfig,
    Listener,
    NodeConfig,
    Problem,
    Role,
    load_config,
    schema,
)
from storage.batch import TimestampType
from storage.config import LogConfig

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "config" / "example.toml"
MIB = 1024 * 1024

BASE: dict[str, Any] = {
    "node_id": 1,
    "process_roles": ["controller", "broker"],
    "listeners": ["CLIENT://127.0.0.1:9092", "CONTROLLER://127.0.0.1:9093"],
    "data_dirs": ["/srv/runnel/1"],
    "controller_quorum_voters": "1@127.0.0.1:9093,2@127.0.0.1:9193,3@127.0.0.1:9293",
}


def toml_text(document: dict[str, Any]) -> str:
    """Enough of a TOML writer for these tests: top-level keys, then one table per section."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in document.items() if not isinstance(v, dict)]
    for section, table in document.items():
        if isinstance(table, dict):
            lines.append(f"[{section}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def write(
    tmp_path: Path, changes: dict[str, Any] | None = None, drop: tuple[str, ...] = ()
) -> Path:
    """BASE with ``changes`` merged in (a dict value merges into its section) and ``drop``
    keys removed, written to ``tmp_path/node.toml``."""
    document = copy.deepcopy(BASE)
    for key, value in (changes or {}).items():
        if isinstance(value, dict):
            document.setdefault(key, {}).update(value)
        else:
            document[key] = value
    for key in drop:
        del document[key]
    path = tmp_path / "node.toml"
    path.write_text(toml_text(document))
    return path


def problems(path: Path | None, env: dict[str, str] | None = None) -> tuple[Problem, ...]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, env or {})
    return caught.value.problems


def the_problem(path: Path | None, env: dict[str, str] | None = None) -> Problem:
    found = problems(path, env)
    assert len(found) == 1, "\n".join(map(str, found))
    return found[0]


# -- loading -----------------------------------------------------------------------------------


def test_the_example_file_loads_with_every_section() -> None:
    config = load_config(EXAMPLE, {})
    assert config.node_id == 1
    assert config.process_roles == {Role.CONTROLLER, Role.BROKER}
    assert [str(item) for item in config.listeners] == [
        "CLIENT://127.0.0.1:9092",
        "CONTROLLER://127.0.0.1:9093",
        "REPLICATION://127.0.0.1:9094",
    ]
    assert config.metadata_log_dir == Path("/var/lib/runnel/node-1")
    assert config.quorum_voters() == {1: "127.0.0.1:9093", 2: "127.0.0.1:9193", 3: "127.0.0.1:9293"}
    assert config.metrics_port == 9101
    assert config.rack is None
    assert config.raft == RaftConfig()
    assert config.raft_transport == TransportConfig()
    assert config.log == LogConfig()  # -1 in the file is "no limit", i.e. None
    assert config.controller == ControllerConfig()
    assert config.broker == BrokerConfig()


def test_the_example_file_sets_every_key() -> None:
    document = tomllib.loads(EXAMPLE.read_text())
    for section, keys in schema().items():
        table = document.get(section, {}) if section else document
        commented = {"rack", "cluster_id", "inter_broker_listener_name"}  # shown commented out
        missing = set(keys) - set(table) - commented
        assert not missing, f"config/example.toml lacks {section or 'top-level'} keys {missing}"


def test_defaults_are_safe_and_kraft_like(tmp_path: Path) -> None:
    config = load_config(write(tmp_path), {})
    assert config.controller.unclean_leader_election_enable is False
    assert config.controller.broker_session_timeout_ms == 9000
    assert config.broker.heartbeat_interval_ms == 2000
    assert config.controller.metadata_snapshot_bytes == 20 * MIB
    assert config.controller.leader_imbalance_check_interval_s == 300
    assert config.controller_listener_name == "CONTROLLER"
    assert config.advertised_listeners == ()
    assert config.metrics_port is None
    assert (config.raft, config.log) == (RaftConfig(), LogConfig())


def test_environment_overrides_beat_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, {"raft": {"election_timeout_ms": 1200}, "rack": "file-rack"})
    config = load_config(
        path,
        {
            "RUNNEL_RAFT__ELECTION_TIMEOUT_MS": "1500",
            "RUNNEL_RACK": "env-rack",
            "RUNNEL_CONTROLLER__UNCLEAN_LEADER_ELECTION_ENABLE": "true",
            "RUNNEL_DATA_DIRS": "/d1, /d2",
            "RUNNEL_LOG__RETENTION_MS": "-1",
            "RUNNEL_LOG__MESSAGE_TIMESTAMP_TYPE": "LogAppendTime",
            "RUNNEL_LOG__MIN_CLEANABLE_DIRTY_RATIO": "0.25",
            "RUNNEL_METRICS_PORT": "9200",
            "HOME": "/root",  # not RUNNEL_*: none of the config's business
        },
    )
    assert config.raft.election_timeout_ms == 1500
    assert config.rack == "env-rack"
    assert config.controller.unclean_leader_election_enable is True
    assert config.data_dirs == (Path("/d1"), Path("/d2"))
    assert config.log.retention_ms is None
    assert config.log.message_timestamp_type is TimestampType.LOG_APPEND_TIME
    assert config.log.min_cleanable_dirty_ratio == 0.25
    assert config.metrics_port == 9200
    assert config.origins["raft.election_timeout_ms"] == "env RUNNEL_RAFT__ELECTION_TIMEOUT_MS"
    assert config.origins["node_id"] == str(path)


def test_a_node_can_be_configured_by_environment_alone() -> None:
    config = load_config(
        None,
        {
            "RUNNEL_NODE_ID": "4",
            "RUNNEL_PROCESS_ROLES": "broker",
            "RUNNEL_LISTENERS": "CLIENT://0.0.0.0:9092",
            "RUNNEL_ADVERTISED_LISTENERS": "CLIENT://broker-4.local:9092",
            "RUNNEL_DATA_DIRS": "/srv/4",
            "RUNNEL_CONTROLLER_QUORUM_VOTERS": "1@c1:9093",
            "RUNNEL_RACK": "",  # empty: unset
        },
    )
    assert config.process_roles == {Role.BROKER}
    assert config.advertised("CLIENT") == Listener("CLIENT", "broker-4.local", 9092)
    assert config.rack is None


def test_lists_may_be_one_comma_separated_string_in_the_file(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, {"process_roles": "broker,controller"}), {})
    assert config.process_roles == {Role.BROKER, Role.CONTROLLER}


def test_test_tool_variables_are_not_config(tmp_path: Path) -> None:
    env = {"RUNNEL_CRASH_SEED": "7", "RUNNEL_REWRITE_SCENARIOS": "1"}
    assert load_config(write(tmp_path), env).node_id == 1


def test_describe_is_toml_that_loads_back_to_the_same_config(tmp_path: Path) -> None:
    path = write(tmp_path, {"log": {"retention_ms": -1}, "rack": "r1"})
    config = load_config(path, {"RUNNEL_BROKER__HEARTBEAT_INTERVAL_MS": "1000"})
    text = config.describe()
    assert "heartbeat_interval_ms = 1000  # env RUNNEL_BROKER__HEARTBEAT_INTERVAL_MS" in text
    assert f'rack = "r1"  # {path}' in text
    again = tmp_path / "again.toml"
    again.write_text(text)
    assert load_config(again, {}) == config
    as_dict = config.to_dict()
    assert as_dict["log"]["retention_ms"] is None
    assert as_dict["process_roles"] == ["broker", "controller"]
    assert json.loads(json.dumps(as_dict)) == as_dict


# -- unknown keys ------------------------------------------------------------------------------


def test_an_unknown_file_key_is_named_with_the_closest_known_one(tmp_path: Path) -> None:
    problem = the_problem(write(tmp_path, {"raft": {"electon_timeout_ms": 900}}))
    assert problem.key == "raft.electon_timeout_ms"
    assert problem.source == str(tmp_path / "node.toml")
    assert "did you mean raft.election_timeout_ms?" in problem.message


def test_an_unknown_variable_is_named_with_the_closest_known_one(tmp_path: Path) -> None:
    problem = the_problem(write(tmp_path), {"RUNNEL_RAFT__ELECTON_TIMEOUT_MS": "900"})
    assert problem.key == "raft.electon_timeout_ms"
    assert problem.source == "env RUNNEL_RAFT__ELECTON_TIMEOUT_MS"
    assert "did you mean RUNNEL_RAFT__ELECTION_TIMEOUT_MS?" in problem.message


def test_a_key_in_the_wrong_section_points_at_its_section(tmp_path: Path) -> None:
    problem = the_problem(write(tmp_path, {"controller": {"heartbeat_interval_ms": 1000}}))
    assert problem.key == "controller.heartbeat_interval_ms"
    assert "did you mean broker.heartbeat_interval_ms?" in problem.message


def test_a_top_level_key_written_under_a_section_says_so(tmp_path: Path) -> None:
    problem = the_problem(write(tmp_path, {"raft": {"rack": "r1"}}))
    assert problem.key == "raft.rack"
    assert "top-level rack" in problem.message


def test_an_unknown_section_is_named(tmp_path: Path) -> None:
    problem = the_problem(write(tmp_path, {"raf": {"election_timeout_ms": 900}}))
    assert problem.key == "raf.election_timeout_ms"
    assert "unknown section [raf]" in problem.message
    assert "raft.election_timeout_ms" in problem.message


def test_an_unknown_top_level_variable_is_named(tmp_path: Path) -> None:
    problem = the_problem(write(tmp_path), {"RUNNEL_NODEID": "3"})
    assert (problem.key, problem.source) == ("nodeid", "env RUNNEL_NODEID")
    assert "did you mean RUNNEL_NODE_ID?" in problem.message


# -- wrong types -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "key", "expected"),
    [
        ({"node_id": "one"}, "node_id", "expected an integer"),
        ({"node_id": True}, "node_id", "expected an integer"),
        ({"raft": {"fetch_timeout_ms": 2.5}}, "raft.fetch_timeout_ms", "expected an integer"),
        ({"data_dirs": [1, 2]}, "data_dirs", "expected a string"),
        ({"process_roles": ["controller", "leader"]}, "process_roles", "broker, controller"),
        ({"process_roles": ["broker", "broker"]}, "process_roles", "more than once"),
        ({"listeners": ["CLIENT:9092"]}, "listeners", "is not NAME://host:port"),
        ({"log": {"cleanup_policy": "shred"}}, "log.cleanup_policy", "delete, compact"),
        ({"controller": {"num_partitions": {}}}, "controller.num_partitions", "a table"),
    ],
)
def test_a_wrong_type_in_the_file_names_the_key(
    tmp_path: Path, changes: dict[str, Any], key: str, expected: str
) -> None:
    path = write(tmp_path, changes)
    problem = the_problem(path)
    assert (problem.key, problem.source) == (key, str(path))
    assert expected in problem.message


@pytest.mark.parametrize(
    ("variable", "value", "key", "expected"),
    [
        ("RUNNEL_NODE_ID", "abc", "node_id", "expected an integer, got 'abc'"),
        (
            "RUNNEL_CONTROLLER__UNCLEAN_LEADER_ELECTION_ENABLE",
            "yes",
            "controller.unclean_leader_election_enable",
            "expected true or false",
        ),
        ("RUNNEL_LOG__MIN_CLEANABLE_DIRTY_RATIO", "half", "log.min_cleanable_dirty_ratio", "num"),
        ("RUNNEL_LOG__MESSAGE_TIMESTAMP_TYPE", "now", "log.message_timestamp_type", "create_time"),
    ],
)
def test_a_wrong_type_in_a_variable_names_the_variable(
    tmp_path: Path, variable: str, value: str, key: str, expected: str
) -> None:
    problem = the_problem(write(tmp_path), {variable: value})
    assert (problem.key, problem.source) == (key, f"env {variable}")
    assert expected in problem.message


# -- impossible values -------------------------------------------------------------------------

CLIENT, CONTROLLER = "CLIENT://127.0.0.1:9092", "CONTROLLER://127.0.0.1:9093"


@pytest.mark.parametrize(
    ("changes", "key", "expected"),
    [
        ({"node_id": -1}, "node_id", "at least 0"),
        ({"raft": {"election_timeout_ms": -5}}, "raft.election_timeout_ms", "at least 1"),
        ({"raft": {"fetch_max_wait_ms": 1500}}, "raft.fetch_max_wait_ms", "twice"),
        ({"raft_transport": {"request_timeout_ms": 0}}, "raft_transport.request_timeout_ms", "1"),
        ({"log": {"segment_bytes": 10}}, "log.segment_bytes", "at least 128"),
        ({"log": {"min_cleanable_dirty_ratio": 1.5}}, "log.min_cleanable_dirty_ratio", "[0, 1]"),
        (
            {"controller": {"broker_session_timeout_ms": 0}},
            "controller.broker_session_timeout_ms",
            "at least 1",
        ),
        (
            {"controller": {"leader_imbalance_per_broker_percentage": 101}},
            "controller.leader_imbalance_per_broker_percentage",
            "at most 100",
        ),
        ({"broker": {"heartbeat_interval_ms": -2000}}, "broker.heartbeat_interval_ms", "least 1"),
        (
            {"broker": {"replica_read_write_timeout_ms": 0}},
            "broker.replica_read_write_timeout_ms",
            "at least 1",
        ),
        (
            {"broker": {"log_maintenance_interval_ms": 0}},
            "broker.log_maintenance_interval_ms",
            "at least 1",
        ),
        (
            {"broker": {"heartbeat_interval_ms": 9000}},
            "broker.heartbeat_interval_ms",
            "must be below controller.broker_session_timeout_ms (9000)",
        ),
        (
            {"controller": {"broker_session_timeout_ms": 1500}},
            "controller.broker_session_timeout_ms",
            "heartbeat_interval_ms (2000) must be below",
        ),
        (
            {"raft_transport": {"max_message_bytes": 1024 * 1024}},
            "raft_transport.max_message_bytes",
            "cannot carry 8388608 bytes",
        ),
        (
            {"broker": {"fetch_session_expiry_ms": 30_000}},
            "broker.fetch_session_expiry_ms",
            "must be above fetch_max_wait_ms (30000)",
        ),
        (
            {"broker": {"max_incremental_fetch_session_cache_slots": -1}},
            "broker.max_incremental_fetch_session_cache_slots",
            "at least 0",
        ),
        (
            {"log": {"max_message_bytes": 104_857_600}},
            "log.max_message_bytes",
            "socket_request_max_bytes (104857600) must be at least log.max_message_bytes "
            "(104857600) + 67584",
        ),
        (
            {"server": {"socket_request_max_bytes": 1_048_588}},
            "server.socket_request_max_bytes",
            "must be at least log.max_message_bytes (1048588) + 67584",
        ),
        (
            {"controller": {"num_partitions": 10_001}},
            "controller.num_partitions",
            "at most 10000, the most partitions a topic may have",
        ),
        (
            {"controller": {"num_partitions": 50, "max_cluster_partitions": 40}},
            "controller.num_partitions",
            "must be at most max_cluster_partitions (40)",
        ),
        (
            {"controller": {"max_cluster_partitions": 0}},
            "controller.max_cluster_partitions",
            "at least 1",
        ),
        (
            {"controller": {"metadata_snapshot_bytes": 1}},
            "controller.metadata_snapshot_bytes",
            "must be at least 1024, got 1",
        ),
        ({"metrics_port": 70000}, "metrics_port", "out of range"),
        ({"metrics_port": 9092}, "metrics_port", "already used by a listener"),
        ({"rack": " "}, "rack", "is empty"),
        ({"data_dirs": []}, "data_dirs", "names no directory"),
        ({"data_dirs": ["/a", "/b/../a"]}, "data_dirs", "/a more than once"),
        ({"process_roles": []}, "process_roles", "names no role"),
    ],
)
def test_an_impossible_value_names_the_key_and_the_file(
    tmp_path: Path, changes: dict[str, Any], key: str, expected: str
) -> None:
    path = write(tmp_path, changes)
    problem = the_problem(path)
    assert (problem.key, problem.source) == (key, str(path))
    assert expected in problem.message


@pytest.mark.parametrize(
    "changes",
    [
        {"server": {"socket_request_max_bytes": 1_048_588 + 66 * 1024}},
        {"log": {"max_message_bytes": 104_857_600 - 66 * 1024}},
        {"controller": {"num_partitions": 10_000}},
        {"controller": {"num_partitions": 40, "max_cluster_partitions": 40}},
        {"controller": {"metadata_snapshot_bytes": 1024}},
    ],
)
def test_settings_at_the_edge_of_a_relation_load(tmp_path: Path, changes: dict[str, Any]) -> None:
    load_config(write(tmp_path, changes), {})


BROKER_ONLY: dict[str, Any] = {"process_roles": ["broker"], "node_id": 4, "listeners": [CLIENT]}


@pytest.mark.parametrize(
    ("roles", "listeners", "node_id"),
    [(["broker"], [CLIENT], 4), (["controller"], [CONTROLLER], 1)],
)
def test_heartbeat_and_session_timeout_are_compared_only_on_a_combined_node(
    tmp_path: Path, roles: list[str], listeners: list[str], node_id: int
) -> None:
    """A broker-only node's [controller] section is not what the controllers fence with, and
    a controller-only node sends no heartbeats: neither is held to the relation."""
    slow = {"broker": {"heartbeat_interval_ms": 9000}}
    changes = {"process_roles": roles, "listeners": listeners, "node_id": node_id} | slow
    config = load_config(write(tmp_path, changes), {})
    assert config.broker.heartbeat_interval_ms == config.controller.broker_session_timeout_ms


def test_a_broker_only_node_is_held_to_the_request_size_relation(tmp_path: Path) -> None:
    changes = BROKER_ONLY | {"server": {"socket_request_max_bytes": 1_048_588}}
    problem = the_problem(write(tmp_path, changes))
    assert problem.key == "server.socket_request_max_bytes"
    controller_only = {"process_roles": ["controller"], "listeners": [CONTROLLER]}
    load_config(write(tmp_path, controller_only | {"server": changes["server"]}), {})


def test_an_impossible_value_from_a_variable_names_the_variable(tmp_path: Path) -> None:
    variable = "RUNNEL_RAFT__FETCH_TIMEOUT_MS"
    problem = the_problem(write(tmp_path), {variable: "-2000"})
    assert (problem.key, problem.source) == ("raft.fetch_timeout_ms", f"env {variable}")
    assert problem.message == "must be at least 1, got -2000"


# -- listeners, roles and voters ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "key", "expected"),
    [
        ({"listeners": ["CLIENT://127.0.0.1:70000", CONTROLLER]}, "listeners", "out of range"),
        ({"listeners": [CLIENT, CONTROLLER, "CLIENT://127.0.0.1:9094"]}, "listeners", "2 times"),
        (
            {"listeners": [CLIENT, CONTROLLER, "REPLICATION://127.0.0.1:9092"]},
            "listeners",
            "port 9092",
        ),
        ({"listeners": [CLIENT]}, "listeners", "'CONTROLLER' is not among listeners (CLIENT)"),
        (
            {"controller_listener_name": "QUORUM"},
            "controller_listener_name",
            "'QUORUM' is not among listeners (CLIENT, CONTROLLER)",
        ),
        ({"listeners": [CONTROLLER]}, "listeners", "'CLIENT' is not among listeners (CONTROLLER)"),
        (
            {"client_listener_name": "CONTROLLER"},
            "client_listener_name",
            "clients and controllers cannot share the listener CONTROLLER",
        ),
        ({"cluster_id": "a b"}, "cluster_id", "must be 1-64 letters"),
        (
            {"advertised_listeners": ["EXTERNAL://x.example:9092"]},
            "advertised_listeners",
            "EXTERNAL is not among listeners",
        ),
        ({"advertised_listeners": ["CLIENT://0.0.0.0:9092"]}, "advertised_listeners", "dial"),
        (
            {"listeners": ["CLIENT://0.0.0.0:9092", CONTROLLER]},
            "listeners",
            "binds every interface",
        ),
        (
            {"controller_quorum_voters": "2@127.0.0.1:9193,3@127.0.0.1:9293"},
            "controller_quorum_voters",
            "does not name this controller, node 1",
        ),
        (
            {"controller_quorum_voters": "1@127.0.0.1:9999"},
            "controller_quorum_voters",
            "gives node 1 the address 127.0.0.1:9999",
        ),
        (
            {"controller_quorum_voters": "1@other-host:9093"},
            "controller_quorum_voters",
            "but its listener is CONTROLLER://127.0.0.1:9093",
        ),
        ({"controller_quorum_voters": "1@host"}, "controller_quorum_voters", "entry '1@host'"),
        ({"controller_quorum_voters": " "}, "controller_quorum_voters", "is empty"),
        (
            {"process_roles": ["broker"], "listeners": [CLIENT]},
            "node_id",
            "node 1 is a voter in controller_quorum_voters but not a controller",
        ),
        (
            {"process_roles": ["broker"], "node_id": 4},
            "listeners",
            "broker-only node must not listen on the controller listener CONTROLLER",
        ),
        (
            {"inter_broker_listener_name": "INTERNAL"},
            "inter_broker_listener_name",
            "'INTERNAL' is not among listeners (CLIENT, CONTROLLER); followers fetch",
        ),
        (
            {"inter_broker_listener_name": "CONTROLLER"},
            "inter_broker_listener_name",
            "'CONTROLLER' serves gRPC",
        ),
        (
            {
                "listeners": [CLIENT, CONTROLLER, "REPLICATION://127.0.0.1:9094"],
                "inter_broker_listener_name": "REPLICATION",
            },
            "inter_broker_listener_name",
            "'REPLICATION' serves gRPC",
        ),
    ],
)
def test_listener_role_and_voter_rules_name_the_key(
    tmp_path: Path, changes: dict[str, Any], key: str, expected: str
) -> None:
    path = write(tmp_path, changes)
    problem = the_problem(path)
    assert (problem.key, problem.source) == (key, str(path))
    assert expected in problem.message


def test_a_controller_binding_every_interface_matches_its_voter_by_port(tmp_path: Path) -> None:
    listeners = ["CLIENT://127.0.0.1:9092", "CONTROLLER://0.0.0.0:9093"]
    config = load_config(write(tmp_path, {"listeners": listeners}), {})
    assert config.listener("CONTROLLER") == Listener("CONTROLLER", "0.0.0.0", 9093)


def test_a_broker_only_node_is_no_voter(tmp_path: Path) -> None:
    path = write(tmp_path, {"node_id": 4, "process_roles": ["broker"], "listeners": [CLIENT]})
    config = load_config(path, {})
    assert config.process_roles == {Role.BROKER}
    assert 4 not in config.quorum_voters()


# -- reporting ---------------------------------------------------------------------------------


def test_every_missing_required_key_is_named_with_its_variable(tmp_path: Path) -> None:
    path = write(tmp_path, drop=("node_id", "data_dirs", "controller_quorum_voters"))
    found = problems(path)
    assert [p.key for p in found] == ["controller_quorum_voters", "data_dirs", "node_id"]
    assert "RUNNEL_NODE_ID" in found[2].message


def test_all_problems_are_reported_together(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "raft": {"election_timeout_ms": 0, "fetch_max_wait_ms": -1},
            "log": {"segment_byts": 1},
            "broker": {"heartbeat_interval_ms": 10_000},
            "metrics_port": 0,
        },
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path, {"RUNNEL_NODE_ID": "-3"})
    keys = {p.key for p in caught.value.problems}
    assert keys == {
        "raft.election_timeout_ms",
        "raft.fetch_max_wait_ms",
        "log.segment_byts",
        "broker.heartbeat_interval_ms",
        "metrics_port",
        "node_id",
    }
    text = str(caught.value)
    assert text.startswith("invalid configuration (6 problems):\n")
    assert "node_id (env RUNNEL_NODE_ID): must be at least 0, got -3" in text


def test_an_unreadable_or_malformed_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "absent.toml"
    assert the_problem(missing).source == str(missing)
    broken = tmp_path / "broken.toml"
    broken.write_text("node_id = = 1\n")
    problem = the_problem(broken)
    assert (problem.source, problem.message.startswith("not valid TOML")) == (str(broken), True)


def test_a_config_built_in_code_is_checked_too() -> None:
    with pytest.raises(ConfigError, match="controller_quorum_voters") as caught:
        NodeConfig(
            node_id=9,
            process_roles=frozenset({Role.CONTROLLER}),
            listeners=(Listener.parse(CONTROLLER),),
            data_dirs=(Path("/srv/9"),),
            controller_quorum_voters="1@127.0.0.1:9093",
        )
    assert isinstance(caught.value, ValueError)  # callers that catch ValueError still do


def test_an_inter_broker_listener_among_the_listeners_loads(tmp_path: Path) -> None:
    internal = "INTERNAL://127.0.0.1:9095"
    path = write(
        tmp_path,
        {"listeners": [CLIENT, CONTROLLER, internal], "inter_broker_listener_name": "INTERNAL"},
    )
    config = load_config(path, {})
    assert config.inter_broker_listener_name == "INTERNAL"
    assert str(config.listener("INTERNAL")) == internal


def test_a_file_that_is_not_utf8_is_named_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"\xff\xfe")
    problem = the_problem(bad)
    assert (problem.source, problem.message.startswith("not UTF-8 text")) == (str(bad), True)
    from runnel.cli import main  # as `runnel node --config bad.toml` runs it

    assert main(["node", "--config", str(bad)]) == 1
    assert "not UTF-8 text" in capsys.readouterr().err
