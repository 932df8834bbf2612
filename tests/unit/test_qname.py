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
