"""Per-query metrics: the counts equal the queries sent, per rcode, whichever path answered
them (the UDP fast path, the responder's cache, a new reply), with and without EDNS options,
across cluster changes. Hit counters live in the cache entries they count."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import dnslib
import pytest
from prometheus_client import CollectorRegistry

import toposdns.serve.query_metrics as query_metrics_module
import toposdns.serve.udp as udp_module
from tests.differential import Frontends
from tests.helpers import config_of, snapshot_of
from tests.objects import SHOP_WEB, service
from toposdns.serve.blocks import BlockConfig, Blocks
from toposdns.serve.chain import Request
from toposdns.serve.forward_cache import CachePolicy, CacheSettings
from toposdns.serve.query_metrics import AllServers, QueryMetrics, labels_of
from toposdns.serve.responder import TCP4, UDP4, Responder
from toposdns.wire.encode import encode_bare

SERVICE = service("api", cluster_ip="10.96.0.9")


def query(
    name: str, cookie: bytes | None = None, edns: bool = False, do: bool = False, qtype: str = "A"
) -> bytes:
    q = dnslib.DNSRecord.question(name, qtype)
    q.header.id = random.getrandbits(16)
    flags = "do" if do else ""
    if cookie is not None:
        q.add_ar(dnslib.EDNS0(udp_len=1232, flags=flags, opts=[dnslib.EDNSOption(10, cookie)]))
    elif edns or do:
        q.add_ar(dnslib.EDNS0(udp_len=1232, flags=flags))
    return bytes(q.pack())


def by_zone(metrics: QueryMetrics, family_name: str) -> Counter[str]:
    """A family's samples summed by `zone`, as a scrape reads them."""
    counts: Counter[str] = Counter()
    for family in metrics.collect():
        if family.name == family_name:
            for sample in family.samples:
                if sample.name in (family_name, family_name + "_total"):
                    counts[sample.labels["zone"]] += int(sample.value)
    return counts


def responses(metrics: QueryMetrics) -> Counter[str]:
    """coredns_dns_responses_total by rcode, as a scrape reads it."""
    counts: Counter[str] = Counter()
    for family in metrics.collect():
        if family.name == "coredns_dns_responses":
            for sample in family.samples:
                counts[sample.labels["rcode"]] += int(sample.value)
    return counts


def served(run: object) -> None:
    asyncio.run(run)  # type: ignore[arg-type]


def test_hits_after_a_first_query_with_a_cookie_are_counted() -> None:
    async def run() -> None:
        metrics = QueryMetrics("dns://:53")
        responder = Responder(config_of(), snapshot_of(SHOP_WEB), metrics=metrics)
        frontends = Frontends(responder)
        frontends.over_udp(UDP4, query("web.shop.svc.cluster.local", b"12345678"), "127.0.0.1")
        for _ in range(5):  # the same key: EDNS, without options
            data = query("web.shop.svc.cluster.local", edns=True)
            frontends.over_udp(UDP4, data, "127.0.0.1")
        assert responses(metrics) == {"NOERROR": 6}

    served(run())


def test_a_service_that_appears_is_counted_noerror() -> None:
    async def run() -> None:
        metrics = QueryMetrics("dns://:53")
        responder = Responder(config_of(), snapshot_of(SHOP_WEB), metrics=metrics)
        frontends = Frontends(responder)
        frontends.over_udp(UDP4, query("api.shop.svc.cluster.local", edns=True), "127.0.0.1")
        frontends.over_udp(UDP4, query("api.shop.svc.cluster.local", edns=True), "127.0.0.1")
        responder.update(snapshot_of([*SHOP_WEB, SERVICE]))
        # The first query after the change carries a cookie: the new entry is made by it.
        frontends.over_udp(UDP4, query("api.shop.svc.cluster.local", b"abcdefgh"), "127.0.0.1")
        for _ in range(4):
            data = query("api.shop.svc.cluster.local", edns=True)
            frontends.over_udp(UDP4, data, "127.0.0.1")
        assert responses(metrics) == {"NXDOMAIN": 2, "NOERROR": 5}

    served(run())


def test_counts_equal_the_queries_sent_per_rcode_across_changes() -> None:
    async def run() -> None:
        rng = random.Random(5)
        metrics = QueryMetrics("dns://:53")
        responder = Responder(config_of(), snapshot_of(SHOP_WEB), metrics=metrics)
        frontends = Frontends(responder)
        sent: Counter[str] = Counter()
        names = ["web", "api", "nope", "WEB", "Api"]
        for round_number in range(6):
            objects = [*SHOP_WEB, SERVICE] if round_number % 2 else SHOP_WEB
            responder.update(snapshot_of(objects))
            for _ in range(60):
                name = rng.choice(names)
                exists = name.lower() == "web" or (name.lower() == "api" and round_number % 2)
                cookie = rng.choice((None, None, b"12345678", rng.randbytes(8)))
                data = query(f"{name}.shop.svc.cluster.local", cookie, edns=rng.random() < 0.3)
                if rng.random() < 0.2:
                    reply = responder.respond(data, TCP4, "127.0.0.1")
                    assert isinstance(reply, bytes)
                else:
                    (reply,) = frontends.over_udp(UDP4, data, "127.0.0.1")
                rcode = dnslib.RCODE.get(dnslib.DNSRecord.parse(reply).header.rcode)
                assert rcode == ("NOERROR" if exists else "NXDOMAIN")
                sent[rcode] += 1
        assert responses(metrics) == sent

    served(run())


def cache_series(metrics: QueryMetrics) -> dict[str, float]:
    """The `cache` plugin's series as a scrape reads them: requests, hits and entries by type."""
    found: dict[str, float] = {}
    for family in metrics.collect():
        for sample in family.samples:
            if sample.name.startswith("coredns_cache_"):
                name = sample.name.removeprefix("coredns_cache_").removesuffix("_total")
                kind = sample.labels.get("type")
                assert (sample.labels["server"], sample.labels["zones"]) == ("dns://:53", ".")
                found[f"{name} {kind}" if kind else name] = sample.value
    return found


@pytest.mark.parametrize("disabled", [False, True], ids=["cache", "kubeadm-disable"])
def test_cache_counts_equal_the_queries_sent_across_changes(disabled: bool) -> None:
    # What CoreDNS's `cache` would count in front of the kubernetes plugin: every query a
    # request; a hit for every query after the first of its name (in any letter case; with an
    # OPT record or without: a reply's own here) since the last change, unless the zone is
    # disabled for the cache (kubeadm's `disable success cluster.local`, `disable denial
    # cluster.local`): then every query a miss.
    zone = (("cluster", "local"),)
    policy = CachePolicy(disabled=zone if disabled else ())
    settings = CacheSettings(success=policy, denial=policy)

    async def run() -> None:
        rng = random.Random(9)
        metrics = QueryMetrics("dns://:53")
        responder = Responder(config_of(), snapshot_of(SHOP_WEB), metrics=metrics, cache=settings)
        metrics.cache_entries = responder.cache_entries
        frontends = Frontends(responder)
        sent = 0
        hits: Counter[str] = Counter()
        for round_number in range(5):
            objects = [*SHOP_WEB, SERVICE] if round_number % 2 else SHOP_WEB
            responder.update(snapshot_of(objects))
            seen: set[tuple[str, bool]] = set()
            for _ in range(50):
                name = rng.choice(["web", "api", "nope", "WEB", "Api", "wEb"])
                exists = name.lower() == "web" or (name.lower() == "api" and round_number % 2)
                cookie = rng.choice((None, None, b"12345678"))
                edns = rng.random() < 0.3
                data = query(f"{name}.shop.svc.cluster.local", cookie, edns)
                if rng.random() < 0.2:
                    assert isinstance(responder.respond(data, TCP4, "127.0.0.1"), bytes)
                else:
                    frontends.over_udp(UDP4, data, "127.0.0.1")
                sent += 1
                key = (name.lower(), cookie is not None or edns)
                if key in seen and not disabled:
                    hits["success" if exists else "denial"] += 1
                seen.add(key)
            got = cache_series(metrics)
            assert got["requests"] == sent
            assert (got["hits success"], got["hits denial"]) == (hits["success"], hits["denial"])
            assert got["misses"] == sent - hits.total()
            kept = 0 if disabled else len(seen)
            assert got["entries success"] + got["entries denial"] == kept

    served(run())


def test_one_udp_hit_in_sixteen_reads_the_clock_and_every_hit_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads = []

    def clock() -> float:
        reads.append(1)
        return 1000.0 + len(reads) * 1e-6  # each timed hit takes 1 µs

    async def run() -> None:
        metrics = QueryMetrics("dns://:53")
        responder = Responder(config_of(), snapshot_of(SHOP_WEB), metrics=metrics)
        frontends = Frontends(responder)
        for _ in range(1 + 16 * 4):  # built, then 64 hits on the fast path
            frontends.over_udp(UDP4, query("web.shop.svc.cluster.local"), "127.0.0.1")
        assert responses(metrics) == {"NOERROR": 65}
        (family,) = (
            f for f in metrics.collect() if f.name == "coredns_dns_request_duration_seconds"
        )
        samples = {
            s.name: s.value for s in family.samples if s.labels.get("le") in (None, "0.00025")
        }
        assert samples["coredns_dns_request_duration_seconds_bucket"] == 65
        assert samples["coredns_dns_request_duration_seconds_count"] == 65
        assert samples["coredns_dns_request_duration_seconds_sum"] == pytest.approx(65e-6)

    monkeypatch.setattr(udp_module, "perf_counter", clock)
    monkeypatch.setattr(query_metrics_module, "perf_counter", clock)
    served(run())
    assert len(reads) <= 2 * (1 + 65 // 16) + 2, "a clock read or two per timed query only"


def test_every_servers_series_in_one_family_of_one_registry() -> None:
    # CoreDNS exports each port's queries in the same families, told apart by `server`; a
    # prometheus_client registry refuses a second collector of the same names.
    first, second = QueryMetrics("dns://:53"), QueryMetrics("dns://:5353")
    first.add(labels_of(False, 1, 1, 0, "kubernetes", ".", True), 0.001, 40, 80)
    for _ in range(3):
        second.add(labels_of(True, 1, 1, 5, "", ".", True), 0.001, 40, 40)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(first)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(second)
    registry.unregister(first)
    registry.register(AllServers([first, second]))
    families = list(registry.collect())
    names = [family.name for family in families]
    assert len(names) == len(set(names)) and "coredns_dns_requests" in names
    requests = next(family for family in families if family.name == "coredns_dns_requests")
    by_server = {
        (sample.labels["server"], sample.labels["proto"]): sample.value
        for sample in requests.samples
    }
    assert by_server == {("dns://:53", "udp"): 1, ("dns://:5353", "tcp"): 3}
    for family in families:  # every family has both servers' series
        assert {sample.labels["server"] for sample in family.samples} == {
            "dns://:53",
            "dns://:5353",
        }, family.name


def test_queries_with_the_do_bit_are_counted_on_every_path() -> None:
    # CoreDNS's coredns_dns_do_requests_total (vars/report.go: `if req.Do()`): whichever path
    # answers, the same count. Names built anew, found in the cache, replayed with the same bytes,
    # written from templates (nothing.shop), decoded in full (another class: REFUSED, under
    # `dropped`), over UDP and TCP, with and without options.
    async def run() -> None:
        rng = random.Random(3)
        metrics = QueryMetrics("dns://:53")
        responder = Responder(config_of(), snapshot_of(SHOP_WEB), metrics=metrics)
        frontends = Frontends(responder)
        sent: Counter[str] = Counter()
        flagged: Counter[str] = Counter()
        for _ in range(200):
            name = rng.choice(["web", "WEB", "nothing", "wEb"]) + ".shop.svc.cluster.local"
            do = rng.random() < 0.5
            cookie = rng.choice((None, b"12345678", rng.randbytes(8)))
            data = query(name, cookie, edns=rng.random() < 0.5, do=do)
            zone = "."
            if rng.random() < 0.1:  # another class, which the server refuses before any block
                record = dnslib.DNSRecord.parse(data)
                record.q.qclass = 3
                data, zone = bytes(record.pack()), "dropped"
            if rng.random() < 0.2:
                assert isinstance(responder.respond(data, TCP4, "127.0.0.1"), bytes)
            else:
                (reply,) = frontends.over_udp(UDP4, data, "127.0.0.1")
            sent[zone] += 1
            flagged[zone] += do
        assert by_zone(metrics, "coredns_dns_requests") == sent
        assert by_zone(metrics, "coredns_dns_do_requests") == +flagged
        assert flagged["."] > 50 and flagged["dropped"] > 0

    served(run())


def test_each_query_is_counted_under_the_zone_of_its_block() -> None:
    # CoreDNS's `metrics` in each block counts under the block's zone the name matches; what no
    # block holds is refused by the server under `dropped` (vars.Dropped).
    async def run() -> None:
        metrics = QueryMetrics("dns://:53")

        def consul(request: Request) -> bytes:
            return encode_bare(request.query, 3)

        cluster = (("cluster", "local"),)
        # With `prometheus` (a block without it is not counted: its test is the next one).
        counted = BlockConfig((("consul", "local"),), plugins=("prometheus",))
        blocks = Blocks(cluster, [(counted, consul)])
        responder = Responder(config_of(), snapshot_of(SHOP_WEB), metrics=metrics, blocks=blocks)
        frontends = Frontends(responder)
        asked = {
            "web.shop.svc.cluster.local": ("cluster.local.", 3),
            "nothing.shop.svc.cluster.local": ("cluster.local.", 2),
            "a.consul.local": ("consul.local.", 2),
            "example.org": ("dropped", 1),
        }
        for name, (_, times) in asked.items():
            for count in range(times):
                frontends.over_udp(UDP4, query(name, do=bool(count % 2)), "127.0.0.1")
        expected: Counter[str] = Counter()
        for zone, times in asked.values():
            expected[zone] += times
        assert by_zone(metrics, "coredns_dns_requests") == expected
        assert by_zone(metrics, "coredns_dns_responses") == expected
        assert by_zone(metrics, "coredns_dns_do_requests") == {
            "cluster.local.": 2,
            "consul.local.": 1,
        }
        for family in metrics.collect():
            if family.name == "coredns_dns_requests":
                # As CoreDNS's, a series is there once counted: none for TCP, asked over UDP
                # only (each cached reply has a row for every transport).
                assert {(s.labels["proto"], s.labels["family"]) for s in family.samples} == {
                    ("udp", "1")
                }
            if family.name.startswith("coredns_dns_"):
                zones = {sample.labels["zone"] for sample in family.samples}
                assert zones <= set(expected), family.name
                assert "cluster.local." in zones, family.name

    served(run())


def test_a_block_without_prometheus_is_not_counted() -> None:
    # CoreDNS counts a query in its block's `prometheus` (plugin/metrics/handler.go): a stub
    # domain written without it, as AKS's custom `.server` examples are, counts nothing; what
    # the server refuses before any block is counted still (errorAndMetricsFunc).
    async def run() -> None:
        metrics = QueryMetrics("dns://:53")

        def answered(request: Request) -> bytes:
            return encode_bare(request.query, 0)

        blocks = Blocks(
            [("cluster", "local")],
            [
                (BlockConfig((("consul", "local"),)), answered),
                (BlockConfig((("example", "org"),), plugins=("prometheus",)), answered),
            ],
        )
        config = config_of()
        responder = Responder(config, snapshot_of(SHOP_WEB), metrics=metrics, blocks=blocks)
        frontends = Frontends(responder)
        for name in ("web.shop.svc.cluster.local", "a.consul.local", "a.example.org"):
            for do in (False, True):
                frontends.over_udp(UDP4, query(name, do=do), "127.0.0.1")
        frontends.over_udp(UDP4, query("example.net"), "127.0.0.1")  # in no block: REFUSED
        expected = {"cluster.local.": 2, "example.org.": 2, "dropped": 1}
        assert by_zone(metrics, "coredns_dns_requests") == expected
        assert by_zone(metrics, "coredns_dns_do_requests") == {
            "cluster.local.": 1,
            "example.org.": 1,
        }

    served(run())
