"""What topology does, seen by an operator: toposdns_topology_answers_total{policy,tier} and
toposdns_unplaced_client_queries_total move by exactly the queries of each kind (first answers
and cached ones, UDP and TCP, source addresses and trusted ECS), and /explain on the --http port
says what DNS answers, follows a snapshot change, and refuses bad input with a 400.

The data is examples/topology.yaml (clients on 127.0.0.2-5) plus a service with zone hints; the
tests that only ask run again with the clients placed by their nodes' CIDRs
(examples/topology-cidrs.yaml).
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dns.edns
import dns.message
import dns.query
import dns.rcode
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.support import (
    Server,
    StartServer,
    copy_snapshot,
    http_get,
    replace_file,
    rrset_texts,
    wait_until,
)
from tests.objects import headless

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).parents[2] / "examples"
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
WEB = "web.shop.svc.cluster.local."
LEDGER = "ledger.shop.svc.cluster.local."
CACHE = "cache.shop.svc.cluster.local."
FEED = "feed.shop.svc.cluster.local."
TRUSTED = "127.0.0.100"  # plays a CoreDNS that adds the client's address as ECS
UNPLACED = "10.9.9.9"  # no PodLocator holds it
UDP_ROUNDS, TCP_ROUNDS = 3, 2  # the rounds after the first of each transport hit the cache

# A service with EndpointSlice zone hints: its endpoints in z1 and z2.
FEED_OBJECTS = headless(
    "feed",
    "shop",
    [
        {"addresses": ["10.244.1.40"], "zone": "z1", "hints": {"forZones": [{"name": "z1"}]}},
        {"addresses": ["10.244.3.40"], "zone": "z2", "hints": {"forZones": [{"name": "z2"}]}},
    ],
)

# (source address, ECS address or None, name, type, counted as (policy, tier) or None, unplaced)
QUERIES = [
    ("127.0.0.2", None, WEB, "A", ("topologyKeys", HOSTNAME), False),  # node-a: web-0 is there
    ("127.0.0.3", None, WEB, "A", ("topologyKeys", ZONE), False),  # node-b, zone z1
    ("127.0.0.5", None, WEB, "A", ("topologyKeys", "*"), False),  # node locator, zone z3
    ("127.0.0.1", None, WEB, "A", ("topologyKeys", "*"), True),  # nobody: last key is "*"
    ("127.0.0.4", None, f"_http._tcp.{WEB}", "SRV", ("topologyKeys", HOSTNAME), False),
    ("127.0.0.2", None, WEB, "AAAA", ("topologyKeys", HOSTNAME), False),  # the tier has no AAAA
    ("127.0.0.5", None, LEDGER, "A", ("annotation", "none"), False),  # only key: zone; NODATA
    ("127.0.0.1", None, LEDGER, "A", ("annotation", "none"), True),
    ("127.0.0.2", None, CACHE, "A", ("trafficDistribution", ZONE), False),
    ("127.0.0.5", None, CACHE, "A", ("trafficDistribution", "*"), False),
    ("127.0.0.4", None, FEED, "A", ("hints", ZONE), False),
    ("127.0.0.5", None, FEED, "A", ("hints", "*"), False),  # nothing hinted for z3
    (TRUSTED, "127.0.0.4", WEB, "A", ("topologyKeys", HOSTNAME), False),
    (TRUSTED, "127.0.0.3", LEDGER, "A", ("annotation", ZONE), False),
    (TRUSTED, UNPLACED, WEB, "A", ("topologyKeys", "*"), True),
    (TRUSTED, None, CACHE, "A", ("trafficDistribution", "*"), True),  # the forwarder itself
    ("127.0.0.2", UNPLACED, WEB, "A", ("topologyKeys", HOSTNAME), False),  # ECS not trusted
    # Not topology-filtered answers: other types, endpoint names, other names.
    ("127.0.0.1", None, WEB, "TXT", None, False),
    ("127.0.0.1", None, f"web-1.{WEB}", "A", None, False),
    ("127.0.0.1", None, "nothing.shop.svc.cluster.local.", "A", None, False),
    ("127.0.0.1", None, "dns-version.cluster.local.", "TXT", None, False),
]


SERVER_ARGS = ("--http", "127.0.0.1:0", "--ecs-trust", f"{TRUSTED}/32")


def write_snapshot(directory: Path, example: str = "topology.yaml") -> Path:
    data = yaml.safe_load((EXAMPLES / example).read_text())
    data["items"] += FEED_OBJECTS
    path = directory / "snapshot.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module", params=["topology.yaml", "topology-cidrs.yaml"])
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Server]:
    """One server for the tests that do not change its data (they compare counts before and
    after their own queries)."""
    snapshot = write_snapshot(tmp_path_factory.mktemp("topology"), request.param)
    server = Server(snapshot, SERVER_ARGS)
    server.wait_ready()
    yield server
    assert server.stop() == 0, server.log()


def http_port(server: Server) -> int:
    return int(server.wait_for_log(r"/metrics on 127\.0\.0\.1:(\d+)").group(1))


Series = dict[tuple[str, str], float]


def scrape(port: int) -> tuple[Series, float]:
    """(answers by (policy, tier), unplaced-client queries) from /metrics."""
    status, text = http_get(port, "/metrics")
    assert status == 200
    answers: Series = {}
    unplaced = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "toposdns_topology_answers_total":
                answers[sample.labels["policy"], sample.labels["tier"]] = sample.value
            elif sample.name == "toposdns_unplaced_client_queries_total":
                unplaced = sample.value
    assert unplaced is not None, "toposdns_unplaced_client_queries_total is missing"
    return answers, unplaced


def difference(after: Series, before: Series) -> Series:
    """How far each series moved (only those that did; a counter going back shows negative)."""
    moved = {key: after.get(key, 0) - before.get(key, 0) for key in after.keys() | before.keys()}
    return {key: value for key, value in moved.items() if value}


def ask(server: Server, source: str, ecs: str | None, name: str, rtype: str, tcp: bool) -> Any:
    options: list[dns.edns.Option] | None = [dns.edns.ECSOption(ecs, 32)] if ecs else None
    query = dns.message.make_query(name, rtype, use_edns=0 if ecs else None, options=options)
    send = dns.query.tcp if tcp else dns.query.udp
    return send(query, server.host, port=server.port, timeout=2, source=source)


def test_counters_move_by_exactly_the_queries_of_each_kind(server: Server) -> None:
    port = http_port(server)
    answers_before, unplaced_before = scrape(port)
    expected: Counter[tuple[str, str]] = Counter()
    expected_unplaced = 0
    for source, ecs, name, rtype, counted, unplaced in QUERIES:
        for tcp in [False] * UDP_ROUNDS + [True] * TCP_ROUNDS:
            reply = ask(server, source, ecs, name, rtype, tcp)
            assert reply.rcode() in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN)
            if counted is not None:
                expected[counted] += 1
                expected_unplaced += unplaced
    answers_after, unplaced_after = scrape(port)
    assert difference(answers_after, answers_before) == expected
    assert unplaced_after - unplaced_before == expected_unplaced
    rounds = UDP_ROUNDS + TCP_ROUNDS
    assert expected[("annotation", "none")] == 2 * rounds  # the NODATA answers are there


def explain(port: int, **params: str) -> tuple[int, Any]:
    status, body = http_get(port, "/explain?" + urllib.parse.urlencode(params))
    return status, json.loads(body)


def normalized(records: list[str] | set[str]) -> list[str]:
    return sorted(" ".join(record.split()) for record in records)


@pytest.mark.parametrize(
    ("source", "name", "rtype"),
    [
        ("127.0.0.2", WEB, "A"),
        ("127.0.0.4", WEB, "A"),
        ("127.0.0.1", WEB, "A"),
        ("127.0.0.5", LEDGER, "A"),
        ("127.0.0.4", f"_http._tcp.{WEB}", "SRV"),
        ("127.0.0.4", FEED, "A"),
        ("127.0.0.1", "nothing.shop.svc.cluster.local.", "A"),
    ],
)
def test_explain_agrees_with_dns(server: Server, source: str, name: str, rtype: str) -> None:
    port = http_port(server)
    status, data = explain(port, client=source, name=name, type=rtype)
    assert status == 200
    reply = ask(server, source, None, name, rtype, tcp=False)
    assert data["rcode"] == dns.rcode.to_text(reply.rcode())
    assert normalized(data["answer"]) == normalized(rrset_texts(reply.answer))
    assert normalized(data["additional"]) == normalized(rrset_texts(reply.additional))
    assert data["question"] == {"name": name, "type": rtype}


def test_explain_names_the_tier_the_metrics_count(server: Server) -> None:
    port = http_port(server)
    for source, ecs, name, rtype, counted, _ in QUERIES:
        if counted is None or ecs is not None:
            continue
        status, data = explain(port, client=source, name=name, type=rtype)
        (decision,) = data["topology"]
        assert (decision["policy"]["source"].split()[0], decision["tier"]) == counted


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"client": "not-an-ip", "name": WEB}, "does not appear to be an IPv4 or IPv6 address"),
        ({"client": "127.0.0.2", "name": WEB, "type": "BOGUS"}, "unknown record type 'BOGUS'"),
        ({"client": "127.0.0.2", "name": "web..shop.svc.cluster.local"}, "has an empty label"),
        ({"client": "127.0.0.2", "name": "x" * 64 + ".cluster.local"}, "is not 1 to 63"),
        ({"client": "127.0.0.2", "name": "a b.cluster.local"}, "is not 1 to 63"),
        ({"client": "127.0.0.2", "name": ".".join(["a" * 60] * 5)}, "longer than 255 octets"),
        ({"client": "127.0.0.2", "name": ""}, "the name is empty"),
        ({"name": WEB}, "parameter 'client' is missing"),
        ({"client": "127.0.0.2"}, "parameter 'name' is missing"),
    ],
)
def test_explain_refuses_bad_input(server: Server, params: dict[str, str], message: str) -> None:
    status, data = explain(http_port(server), **params)
    assert status == 400
    assert (
        message in data["error"]
        and "usage: GET /explain?client=IP[/LENGTH]&name=NAME" in data["error"]
    )


def test_explain_follows_a_snapshot_change(start_server: StartServer, tmp_path: Path) -> None:
    snapshot = write_snapshot(tmp_path)
    server = start_server(*SERVER_ARGS, snapshot=snapshot)
    port = http_port(server)

    def explained() -> list[str]:
        status, data = explain(port, client="127.0.0.3", name=WEB)
        assert status == 200
        return normalized(data["answer"])

    def answered() -> list[str]:
        return normalized(rrset_texts(ask(server, "127.0.0.3", None, WEB, "A", tcp=False).answer))

    near = [f"{WEB} 5 IN A 10.244.1.10"]
    assert explained() == near
    assert answered() == near
    assert answered() == near  # from the cache
    # client-b (127.0.0.3) moves to node-c in zone z2.
    data = yaml.safe_load(snapshot.read_text())
    (client_b,) = [o for o in data["items"] if o["metadata"]["name"] == "shop.client-b"]
    client_b["nodeName"] = "node-c"
    client_b["nodeLabels"].update({HOSTNAME: "node-c", ZONE: "z2"})
    replace_file(snapshot, yaml.safe_dump(data, sort_keys=False))
    moved = [f"{WEB} 5 IN A 10.244.3.10", f"{WEB} 5 IN A 10.244.3.11"]
    assert wait_until(lambda: explained() == moved, timeout=5.0), server.log()
    assert answered() == moved
    # The counts outlive the caches that the reload emptied.
    assert scrape(port) == ({("topologyKeys", ZONE): 2, ("topologyKeys", HOSTNAME): 1}, 0)


def test_the_readmes_explain_sample_is_what_the_server_says(
    start_server: StartServer, tmp_path: Path
) -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    question = "/explain?client=127.0.0.5&name=ledger.shop.svc.cluster.local"
    block = readme.split(f"$ curl -s '127.0.0.1:9153{question}'\n", 1)[1].split("\n$ ", 1)[0]
    documented = json.loads(block)
    snapshot = copy_snapshot(tmp_path, EXAMPLES / "topology.yaml")
    server = start_server("--http", "127.0.0.1:0", snapshot=snapshot)
    status, body = http_get(http_port(server), question)
    assert status == 200
    served = json.loads(body)
    # The SOA serial is the time the file was read; the rest is the same, field for field.
    for reply in (served, documented):
        reply["authority"] = [
            re.sub(r"hostmaster\S+ \d+", "SERIAL", rr) for rr in reply["authority"]
        ]
    assert served == documented
