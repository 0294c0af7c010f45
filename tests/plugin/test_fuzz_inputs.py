"""Property-based fuzzing of what the plugin reads from outside: its configuration, the
kubelet's Allocate requests (as bytes, as the wire delivers them) and CDI spec files.

Every input is refused cleanly (ConfigError, INVALID_ARGUMENT, a problem list, a CDI state with
a bounded reason) or accepted correctly (within every bound); nothing ever raises otherwise.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hv_device_plugin import options
from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.cdi import CdiReconciler
from hv_device_plugin.cdi_spec import desired_spec, validate_spec
from hv_device_plugin.config import Config, ConfigError, parse_config
from hv_device_plugin.inputs import MAX_LINE_CHARS, check_resource_name
from hv_device_plugin.request_checks import allocate_problem, max_allocate_bytes, reader

SETTINGS = settings(database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FLAGS = tuple(opt.flag for opt in options.OPTIONS)
# What a careless or hostile value looks like: numbers at and past every edge, non-numbers,
# addresses, paths, names, control characters, and anything at all.
TRICKY = st.sampled_from(
    ["", "0", "-0", "1", "-1", "nan", "NaN", "inf", "-inf", "1e308", "1e-308", "1e999", "0x10",
     "1_000", " 5", "5 ", "+5", "4294967295", "4294967294", "10000", "10001", "65535", "65536",
     "127.0.0.1:0", ":0", "[::1]:0", "x", ":", "256.1.1.1:80", "/", "a/b", "kubernetes.io/x",
     "example.com/kvm", "/dev/kvm", "/dev/null", "auto", "/tmp", "relative", "..", "\n", "\x1b",
     "\u2028", "é", "0" * 50]
)  # fmt: skip
VALUES = st.one_of(TRICKY, st.text(max_size=40), st.from_regex(r"-?[0-9]{0,25}(\.[0-9]{0,5})?"))


def _within_bounds(cfg: Config) -> None:
    """An accepted configuration holds only values its documented bounds allow."""
    assert 1 <= cfg.slots <= options.MAX_SLOTS
    assert 0 <= cfg.device_uid <= options.MAX_ID and 0 <= cfg.device_gid <= options.MAX_ID
    for value, (lo, hi) in (
        (cfg.probe_timeout_s, options.PROBE_TIMEOUT_S),
        (cfg.probe_max_age_s, options.PROBE_MAX_AGE_S),
        (cfg.recheck_interval_s, options.RECHECK_INTERVAL_S),
        (cfg.register_backoff_initial_s, options.REGISTER_BACKOFF_S),
        (cfg.register_backoff_max_s, options.REGISTER_BACKOFF_S),
        (cfg.register_attempt_timeout_s, options.REGISTER_ATTEMPT_TIMEOUT_S),
    ):
        assert lo <= value <= hi  # also false for nan
    assert 1 <= cfg.register_attempts <= options.MAX_REGISTER_ATTEMPTS
    assert cfg.register_backoff_initial_s <= cfg.register_backoff_max_s
    assert check_resource_name(cfg.resource_name) == cfg.resource_name
    if cfg.health_addr is not None:
        assert 0 <= cfg.health_addr[1] <= 65535
    assert cfg.device_plugin_dir.is_absolute() and cfg.cdi_dir.is_absolute()


@SETTINGS
@given(
    flags=st.dictionaries(st.sampled_from(FLAGS), VALUES, max_size=4),
    env=st.dictionaries(st.sampled_from(FLAGS), VALUES, max_size=3),
    stray=st.lists(st.one_of(TRICKY, st.text(max_size=20)), max_size=2),
)
@example(flags={"slots": "1000000000"}, env={}, stray=[])
@example(flags={}, env={"probe-timeout": "nan"}, stray=[])
@example(flags={}, env={}, stray=["--bogus", "\x1b[31m" * 500])
def test_config_parser_refuses_cleanly_or_accepts_within_bounds(
    flags: dict[str, str], env: dict[str, str], stray: list[str]
) -> None:
    argv = [*(f"--{k}={v}" for k, v in flags.items()), *stray]
    environ = {options.env_name(k): v.replace("\0", "") for k, v in env.items()}
    try:
        cfg = parse_config(argv, environ)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) <= 2 * MAX_LINE_CHARS, message
        named = [f for f in FLAGS if message.startswith(f"--{f}")]
        for flag in named:  # a value from the environment is refused naming its variable
            from_env = flag in env and flag not in flags
            assert (f"(set by {options.env_name(flag)})" in message) == from_env, message
        return
    _within_bounds(cfg)


KNOWN = tuple(f"kvm-{i}" for i in range(8))
LIMIT = len(KNOWN)
IDS = st.one_of(st.sampled_from(KNOWN), st.text(max_size=12), st.text(min_size=100, max_size=300))


def _refusal_is_right(problem: str, request: pb.AllocateRequest) -> None:
    ids = [i for c in request.container_requests for i in c.devices_ids]
    valid = (
        bool(request.container_requests)
        and all(c.devices_ids for c in request.container_requests)
        and len(ids) <= LIMIT
        and set(ids) <= set(KNOWN)
        and len(set(ids)) == len(ids)
    )
    assert (problem == "") == valid, (problem, ids)
    assert len(problem) <= MAX_LINE_CHARS and "\n" not in problem


@SETTINGS
@given(st.lists(st.lists(IDS, max_size=12), max_size=12))
def test_allocate_checks_refuse_exactly_the_invalid_requests(containers: list[list[str]]) -> None:
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
    )
    read = reader(pb.AllocateRequest.FromString, max_allocate_bytes(KNOWN), "request")
    parsed = read(request.SerializeToString())
    problem = allocate_problem(parsed, frozenset(KNOWN), LIMIT)
    if isinstance(parsed, pb.AllocateRequest):
        _refusal_is_right(problem, parsed)
    else:  # refused unread: then it was too large to be valid anyway
        assert problem and len(request.SerializeToString()) > max_allocate_bytes(KNOWN)
        _refusal_is_right("not valid", request)


@SETTINGS
@given(st.binary(max_size=600))
def test_allocate_reads_any_bytes_without_raising(raw: bytes) -> None:
    read = reader(pb.AllocateRequest.FromString, max_allocate_bytes(KNOWN), "request")
    problem = allocate_problem(read(raw), frozenset(KNOWN), LIMIT)
    assert isinstance(problem, str) and len(problem) <= MAX_LINE_CHARS


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=20,
)
DESIRED = desired_spec(device_name="kvm", device_path="/dev/kvm")


def _mutated(data: st.DataObject) -> bytes:
    """The desired spec with one value, anywhere in it, replaced by arbitrary JSON."""
    spec = json.loads(DESIRED)
    node, path = spec, []
    while isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
        key = data.draw(
            st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node)))
        )
        path.append(key)
        node = node[key]
    if not path:
        return json.dumps(data.draw(JSON)).encode()
    parent = spec
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = data.draw(JSON)
    return json.dumps(spec).encode()


@pytest.fixture(scope="module")
def cdi_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="hv-fuzz-cdi-"))
    yield root
    shutil.rmtree(root)


@SETTINGS
@given(data=st.data())
@example(data=None)
def test_cdi_reader_classifies_any_file(cdi_dir: Path, data: st.DataObject | None) -> None:
    if data is None:  # 100,000 nested arrays: a RecursionError before the fix
        content = b"[" * 100_000 + b"]" * 100_000
    else:
        content = data.draw(
            st.one_of(
                st.binary(max_size=300),
                st.builds(lambda v: json.dumps(v).encode(), JSON),
                st.builds(_mutated, st.data()),
            )
        )
    problems = validate_spec(content)
    assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)
    (cdi_dir / "hyperlight.json").write_bytes(content)
    (cdi_dir / "hyperlight.json").chmod(0o644)
    status = CdiReconciler(cdi_dir, "hyperlight.json", DESIRED).inspect()
    assert (status.state == "desired") == (content == DESIRED), status
    assert status.state in ("desired", "malformed", "stale"), status
    assert (status.state == "malformed") == bool(problems) or content == DESIRED
    assert len(status.reason) <= 2 * MAX_LINE_CHARS and "\n" not in status.reason
