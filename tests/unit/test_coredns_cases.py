"""CoreDNS's own handler test tables (and rules derived from its source), run end to end.

Each case is resolved, encoded to wire bytes and parsed back with dnslib, so the resolver and
the encoder are checked together against upstream's expectations in tests/cases/coredns.yaml.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import dnslib
import pytest
import yaml

from tests.helpers import config_of, normal_rrs, normal_text, snapshot_of
from toposdns.resolve.resolver import resolve
from toposdns.store.snapshot import Snapshot
from toposdns.wire.codes import RCODE_NAMES
from toposdns.wire.decode import Query
from toposdns.wire.encode import MAX_TCP_SIZE, encode_reply
from toposdns.wire.records import type_code

CASES_FILE = Path(__file__).parent.parent / "cases" / "coredns.yaml"
DATA = yaml.safe_load(CASES_FILE.read_text())


@cache
def fixture(name: str, synced: bool) -> Snapshot:
    return snapshot_of(DATA["fixtures"][name], synced=synced)


def labels(qname: str) -> tuple[str, ...]:
    return tuple(qname.rstrip(".").split(".")) if qname != "." else ()


@pytest.mark.parametrize("case", DATA["cases"], ids=[c["name"] for c in DATA["cases"]])
def test_case(case: dict[str, Any]) -> None:
    options = {**DATA["defaults"], **case.get("options", {})}
    config = config_of(
        zones=options["zones"],
        ttl=options["ttl"],
        pods=options["pods"],
        endpoint_pod_names=options["endpoint_pod_names"],
        namespaces=options["namespaces"],
        ns_addresses=options["ns_addresses"],
        zonal=options["zonal"],
        ignore_empty_service=options["ignore_empty_service"],
        noendpoints=options["noendpoints"],
    )
    snapshot = fixture(case["fixture"], options["synced"])
    name = labels(case["qname"])
    qtype = type_code(case["qtype"])
    answer = resolve(name, qtype, snapshot, config)

    wire = encode_reply(Query(0x1234, 0x0100, name, qtype, 1), answer, MAX_TCP_SIZE)
    reply = dnslib.DNSRecord.parse(wire)
    assert RCODE_NAMES[reply.header.rcode] == case["rcode"], case.get("notes")
    assert reply.header.id == 0x1234 and reply.header.qr == 1 and reply.header.ra == 0
    assert reply.header.aa == (case["rcode"] != "REFUSED")
    assert str(reply.q.qname) == case["qname"]
    assert normal_rrs(reply.rr) == normal_text(case.get("answer", [])), case.get("notes")
    assert normal_rrs(reply.auth) == normal_text(case.get("ns", [])), case.get("notes")
    assert normal_rrs(reply.ar) == normal_text(case.get("extra", [])), case.get("notes")
