"""The snapshot file is polled and reloaded; a bad reload is refused and the old data stays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dns.message
import dns.rcode
import pytest
import yaml

from tests.integration.support import (
    Server,
    StartServer,
    addresses,
    replace_file,
    udp,
    wait_until,
)
from tests.objects import endpoint_slice, service

pytestmark = pytest.mark.integration

RELOAD_TIMEOUT = 5.0

CHECKOUT = service("checkout", cluster_ip="10.96.10.30")

BROKEN_SLICE = endpoint_slice(
    "cart", endpoints=[{"addresses": ["not-an-ip"], "conditions": {"ready": True}}], name="cart-zz9"
)

CART = service("cart", cluster_ip="None")


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def write(path: Path, data: dict[str, Any]) -> None:
    replace_file(path, yaml.safe_dump(data, sort_keys=False))


def rcode_and_addresses(server: Server, name: str) -> tuple[int, set[str]]:
    reply = udp(server, dns.message.make_query(name, "A"))
    return reply.rcode(), addresses(reply)


def serial(server: Server) -> int:
    reply = udp(server, dns.message.make_query("cluster.local.", "SOA"))
    value: int = reply.answer[0][0].serial
    return value


def test_reload_adds_a_service_and_refuses_a_bad_file(start_server: StartServer) -> None:
    server = start_server()
    path = server.snapshot
    checkout = "checkout.shop.svc.cluster.local."
    assert rcode_and_addresses(server, checkout) == (dns.rcode.NXDOMAIN, set())
    first_serial = serial(server)

    # 1. A good edit: the new service answers within a bounded wait.
    good = load(path)
    good["items"].append(CHECKOUT)
    write(path, good)
    assert wait_until(
        lambda: rcode_and_addresses(server, checkout) == (dns.rcode.NOERROR, {"10.96.10.30"}),
        RELOAD_TIMEOUT,
    ), f"the new service did not answer within {RELOAD_TIMEOUT}s; log:\n{server.log()}"
    server.wait_for_log(r"INFO reloaded .*snapshot\.yaml", timeout=1.0)
    assert serial(server) > first_serial

    # 2. A bad edit: refused, naming the file, the object and the field; nothing changes.
    lines_before = server.line_count()
    bad = load(path)
    bad["items"] += [CART, BROKEN_SLICE]
    bad["items"] = [i for i in bad["items"] if i["metadata"]["name"] != "frontend"]
    write(path, bad)
    refused = server.wait_for_log(
        r"ERROR reload refused.*", timeout=RELOAD_TIMEOUT, start=lines_before
    )
    line = refused.group(0)
    assert str(path) in line
    assert "EndpointSlice shop/cart-zz9" in line
    assert "endpoints[0].addresses" in line
    assert "not-an-ip" in line
    # The last good data keeps serving: the new service, the old ones, and not the bad edit.
    assert rcode_and_addresses(server, checkout) == (dns.rcode.NOERROR, {"10.96.10.30"})
    assert rcode_and_addresses(server, "frontend.shop.svc.cluster.local.") == (
        dns.rcode.NOERROR,
        {"10.96.10.10"},
    )
    assert rcode_and_addresses(server, "web-0.web.shop.svc.cluster.local.") == (
        dns.rcode.NOERROR,
        {"10.244.1.10"},
    )
    assert rcode_and_addresses(server, "cart.shop.svc.cluster.local.")[0] == dns.rcode.NXDOMAIN

    # 3. Fixing the file is picked up again; removing a service makes it NXDOMAIN.
    fixed = load(path)
    fixed["items"] = [i for i in good["items"] if i["metadata"]["name"] != "frontend"]
    write(path, fixed)
    assert wait_until(
        lambda: (
            rcode_and_addresses(server, "frontend.shop.svc.cluster.local.")[0] == dns.rcode.NXDOMAIN
        ),
        RELOAD_TIMEOUT,
    ), f"the removal was not served within {RELOAD_TIMEOUT}s; log:\n{server.log()}"
    assert rcode_and_addresses(server, checkout) == (dns.rcode.NOERROR, {"10.96.10.30"})


def test_unparsable_reload_and_deleted_file_keep_serving(start_server: StartServer) -> None:
    server = start_server()
    path = server.snapshot
    lines_before = server.line_count()
    replace_file(path, "items: [unclosed\n")
    line = server.wait_for_log(
        r"ERROR reload refused.*", timeout=RELOAD_TIMEOUT, start=lines_before
    ).group(0)
    assert str(path) in line and "not valid YAML or JSON" in line
    assert rcode_and_addresses(server, "api.shop.svc.cluster.local.") == (
        dns.rcode.NOERROR,
        {"10.96.10.20"},
    )
    # A file that disappears (as during a ConfigMap swap) changes nothing either.
    path.unlink()
    lines_before = server.line_count()
    assert not wait_until(lambda: server.line_count() > lines_before, 1.5)
    assert rcode_and_addresses(server, "api.shop.svc.cluster.local.") == (
        dns.rcode.NOERROR,
        {"10.96.10.20"},
    )
