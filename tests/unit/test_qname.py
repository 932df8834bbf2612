"""The name grammar (CoreDNS parse.go) as a table."""

from __future__ import annotations

import pytest

from toposdns.resolve.qname import InvalidName, Request, parse_request


@pytest.mark.parametrize(
    ("base", "want"),
    [
        ((), Request()),
        (("svc",), Request()),
        (("pod",), Request()),
        (("ns", "svc"), Request("svc", "ns")),
        (("web", "ns", "svc"), Request("svc", "ns", "web")),
        (("web-0", "web", "ns", "svc"), Request("svc", "ns", "web", endpoint="web-0")),
        (
            ("_http", "_tcp", "web", "ns", "svc"),
            Request("svc", "ns", "web", port="http", protocol="tcp"),
        ),
        (
            ("http", "tcp", "web", "ns", "svc"),
            Request("svc", "ns", "web", port="http", protocol="tcp"),
        ),
        (("10-0-0-1", "ns", "pod"), Request("pod", "ns", "10-0-0-1")),
        (("x", "10-0-0-1", "ns", "pod"), Request("pod", "ns", "10-0-0-1")),
    ],
)
def test_parse(base: tuple[str, ...], want: Request) -> None:
    assert parse_request(base) == want


# parse_test.go TestParseRequest, the zone-scoped rows (parsed with the `zonal` option).
@pytest.mark.parametrize(
    ("base", "want"),
    [
        (
            ("us-west-2a", "pin", "_zone", "webs", "ns", "svc"),
            Request("svc", "ns", "webs", topology_zone="us-west-2a"),
        ),
        (
            ("us-west-2a", "prefer", "_zone", "webs", "ns", "svc"),
            Request("svc", "ns", "webs", topology_zone="us-west-2a", prefer=True),
        ),
        (  # a zone value may hold dots: it spans every label left of the directive
            ("corp", "example", "com", "pin", "_zone", "webs", "ns", "svc"),
            Request("svc", "ns", "webs", topology_zone="corp.example.com"),
        ),
        (  # two labels left of the service are still port and protocol
            ("us-west-2a", "_zone", "webs", "ns", "svc"),
            Request("svc", "ns", "webs", port="us-west-2a", protocol="zone"),
        ),
    ],
)
def test_parse_zonal(base: tuple[str, ...], want: Request) -> None:
    assert parse_request(base, zonal=True) == want


@pytest.mark.parametrize(
    "base",
    [
        ("web", "ns", "dns"),
        ("dns-version",),
        ("a", "b", "c", "web", "ns", "svc"),
        ("a", "b", "c", "10-0-0-1", "ns", "pod"),
        ("svc1", "testns", "svc", "cluster", "local", "testns", "svc"),
    ],
)
def test_invalid(base: tuple[str, ...]) -> None:
    with pytest.raises(InvalidName):
        parse_request(base)
    with pytest.raises(InvalidName):
        parse_request(base, zonal=True)


# parse_test.go TestParseInvalidRequest: the zonal shape without the option, and the shapes the
# option never reads (pods, unknown directives).
@pytest.mark.parametrize(
    ("base", "zonal"),
    [
        (("us-west-2a", "pin", "_zone", "webs", "ns", "svc"), False),
        (("us-west-2a", "pin", "_zone", "webs", "ns", "pod"), True),
        (("us-west-2a", "florp", "_zone", "webs", "ns", "svc"), True),
        (("us-west-2a", "pin", "zone", "webs", "ns", "svc"), True),
    ],
)
def test_invalid_zonal(base: tuple[str, ...], zonal: bool) -> None:
    with pytest.raises(InvalidName):
        parse_request(base, zonal=zonal)
