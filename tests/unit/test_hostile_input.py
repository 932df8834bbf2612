"""Property tests (Hypothesis): on any input, the parsers of untrusted data raise only their
documented errors.

- `decode_query` (any datagram): a Query, or Dropped / Rejected.
- `read_client_subnet` (any ECS option value): a ClientSubnet, or ValueError.
- `convert_object` (any decoded JSON/YAML value): a record, or ObjectError.
- `parse_records` (any file content): records, or SnapshotError.

Bounded for CI: a few hundred examples each, no example database, a few seconds in all.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import dns.edns
import dns.message
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.support import FIXTURE_SNAPSHOT
from toposdns.source.snapshot_file import SnapshotError, parse_records
from toposdns.store.convert import ObjectError, convert_object, describe
from toposdns.wire.decode import (
    ClientSubnet,
    Dropped,
    Query,
    Rejected,
    decode_query,
    read_client_subnet,
)

BOUNDED = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def real_queries() -> list[bytes]:
    """Queries as resolvers send them: plain, EDNS, EDNS with a client subnet, DNS cookie."""
    plain = dns.message.make_query("web.shop.svc.cluster.local.", "A")
    edns = dns.message.make_query("_http._tcp.web.shop.svc.cluster.local.", "SRV", use_edns=0)
    ecs = dns.message.make_query(
        "web.shop.svc.cluster.local.",
        "AAAA",
        use_edns=0,
        options=[dns.edns.ECSOption("10.244.1.0", 24), dns.edns.GenericOption(10, b"c" * 8)],
    )
    return [q.to_wire() for q in (plain, edns, ecs)]


@st.composite
def mutated_queries(draw: st.DrawFn) -> bytes:
    """A real query with bytes overwritten, inserted, cut, or spliced with another."""
    data = bytearray(draw(st.sampled_from(real_queries())))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["set", "insert", "cut", "splice", "pointer"]))
        at = draw(st.integers(0, len(data)))
        if kind == "set" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "cut":
            del data[at:]
        elif kind == "splice":
            data[at:] = draw(st.sampled_from(real_queries()))[draw(st.integers(0, 40)) :]
        else:  # a compression pointer to anywhere, even past the end
            data[at:at] = bytes([0xC0 | draw(st.integers(0, 63)), draw(st.integers(0, 255))])
    return bytes(data)


@BOUNDED
@given(st.one_of(st.binary(max_size=600), mutated_queries()))
def test_decode_query_raises_only_dropped_or_rejected(data: bytes) -> None:
    try:
        query = decode_query(data)
    except (Dropped, Rejected):
        return
    assert isinstance(query, Query) and len(query.name) <= 127


@BOUNDED
@given(
    st.one_of(
        st.binary(max_size=24),
        st.builds(
            lambda family, prefix, scope, address: bytes([0, family, prefix, scope]) + address,
            st.integers(0, 3),
            st.integers(0, 255),
            st.sampled_from([0, 0, 0, 1]),
            st.binary(max_size=17),
        ),
    )
)
def test_read_client_subnet_raises_only_value_error(value: bytes) -> None:
    try:
        subnet = read_client_subnet(value)
    except ValueError:
        return
    assert isinstance(subnet, ClientSubnet) and subnet.family in (1, 2)


def json_values(keys: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """Any value a JSON or YAML document can hold, with mapping keys mostly from `keys`."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**40), 2**40),
        st.floats(allow_nan=True),
        st.text(max_size=20),
        st.sampled_from(["None", "10.0.0.1", "fd00::1", "ClusterIP", "ExternalName", ""]),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(st.one_of(keys, st.integers(0, 3)), inner, max_size=5),
        ),
        max_leaves=12,
    )


FIXTURE_OBJECTS: list[dict[str, Any]] = yaml.safe_load(FIXTURE_SNAPSHOT.read_text())["items"]


def keys_of(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value).union(*map(keys_of, value.values()))
    if isinstance(value, list):
        return set().union(*map(keys_of, value))
    return set()


FIELD_NAMES = sorted(keys_of(FIXTURE_OBJECTS) | {"hints", "forZones", "topologyKeys"})
VALUES = json_values(st.sampled_from(FIELD_NAMES))


@st.composite
def mutated_objects(draw: st.DrawFn) -> Any:
    """A real object from the test fixture with some fields replaced by anything."""
    obj: Any = copy.deepcopy(draw(st.sampled_from(FIXTURE_OBJECTS)))
    for _ in range(draw(st.integers(1, 4))):
        path: list[Any] = []
        node = obj
        while isinstance(node, (dict, list)) and node and draw(st.booleans()):
            key = draw(st.sampled_from(list(node) if isinstance(node, dict) else range(len(node))))
            path.append(key)
            node = node[key]
        value = draw(VALUES)
        if not path:
            return value
        parent = obj
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
    return obj


@settings(BOUNDED, max_examples=200)
@given(st.one_of(VALUES, mutated_objects()))
def test_convert_object_raises_only_object_error(raw: Any) -> None:
    try:
        record = convert_object(raw)
    except ObjectError as exc:
        assert str(exc).startswith(describe(raw))
        return
    assert record.name


FIXTURE_BYTES = FIXTURE_SNAPSHOT.read_bytes()


@st.composite
def mutated_files(draw: st.DrawFn) -> bytes:
    """The fixture file, or its JSON form, with bytes changed, cut or repeated."""
    data = bytearray(draw(st.sampled_from([FIXTURE_BYTES, json.dumps(FIXTURE_OBJECTS).encode()])))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["set", "cut", "repeat", "insert"]))
        if kind == "set" and at < len(data):
            data[at] = draw(st.sampled_from(b"\x00\xff\n\t :-[]{}&*!|>'\"#%@`,?"))
        elif kind == "cut":
            del data[at:]
        elif kind == "repeat":
            data[at:at] = data[at : at + draw(st.integers(1, 200))]
        else:
            data[at:at] = draw(st.binary(max_size=10))
    return bytes(data)


@settings(BOUNDED, max_examples=150)
@given(st.one_of(st.binary(max_size=200), mutated_files()))
def test_parse_records_raises_only_snapshot_error(data: bytes) -> None:
    path = Path("/srv/snapshot.yaml")
    try:
        records = parse_records(path, data)
    except SnapshotError as exc:
        assert str(exc).startswith(f"{path}: ") and "\n" not in str(exc)
        return
    assert records
