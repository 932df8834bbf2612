"""The store's records: an Endpoint, held compactly, behaves as the frozen value it was."""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError, replace

import pytest

from toposdns.store.model import NODE_NAME, Endpoint, EndpointSlice, PodLocator, Port

# (constructor arguments, the fields read back)
ENDPOINTS = [
    ((("10.1.0.1",),), (("10.1.0.1",), "", "", "", "", None, None)),
    ((("10.1.0.1", "10.1.0.2"), "h"), (("10.1.0.1", "10.1.0.2"), "h", "", "", "", None, None)),
    (((),), ((), "", "", "", "", None, None)),
    (
        (("fd00::1",), "", "pod", "n1", "z1", ("z1",), None),
        (("fd00::1",), "", "pod", "n1", "z1", ("z1",), None),
    ),
    (
        (("10.1.0.1",), "", "", "", "", None, ("n1",)),
        (("10.1.0.1",), "", "", "", "", None, ("n1",)),
    ),
    ((("10.1.0.1",), "", "", "", "", (), ()), (("10.1.0.1",), "", "", "", "", (), ())),
]


@pytest.mark.parametrize(("args", "want"), ENDPOINTS)
def test_endpoint_reads_back_what_it_was_given(
    args: tuple[object, ...], want: tuple[object, ...]
) -> None:
    ep = Endpoint(*args)  # type: ignore[arg-type]
    got = (ep.addresses, ep.hostname, ep.pod_name, ep.node_name, ep.zone)
    assert got + (ep.hint_zones, ep.hint_nodes) == want
    same = Endpoint(*args)  # type: ignore[arg-type]
    assert ep == same and hash(ep) == hash(same) and ep is not same
    assert pickle.loads(pickle.dumps(ep, pickle.HIGHEST_PROTOCOL)) == ep
    assert repr(ep).startswith(f"Endpoint(addresses={want[0]!r}, hostname=")


def test_endpoint_differs_in_any_field_and_is_frozen() -> None:
    base = Endpoint(("10.1.0.1",), "h", "p", "n", "z", ("z",), ("n",))
    others = [
        Endpoint(("10.1.0.2",), "h", "p", "n", "z", ("z",), ("n",)),
        Endpoint(("10.1.0.1", "10.1.0.1"), "h", "p", "n", "z", ("z",), ("n",)),
        Endpoint(("10.1.0.1",), "", "p", "n", "z", ("z",), ("n",)),
        Endpoint(("10.1.0.1",), "h", "", "n", "z", ("z",), ("n",)),
        Endpoint(("10.1.0.1",), "h", "p", "", "z", ("z",), ("n",)),
        Endpoint(("10.1.0.1",), "h", "p", "n", "", ("z",), ("n",)),
        Endpoint(("10.1.0.1",), "h", "p", "n", "z", None, ("n",)),
        Endpoint(("10.1.0.1",), "h", "p", "n", "z", ("z",), None),
    ]
    assert all(base != other for other in others)
    assert base != ("10.1.0.1",)
    with pytest.raises(FrozenInstanceError):
        base.zone = "z2"
    with pytest.raises(FrozenInstanceError):
        del base.hostname


def test_slice_knows_whether_its_addresses_are_canonical() -> None:
    http = (Port("http", "TCP", 80),)
    canonical = EndpointSlice("a", "s", "svc", http, (Endpoint(("10.1.0.1", "fd00::1")),))
    written = replace(canonical, endpoints=(Endpoint(("10.1.0.1",)), Endpoint(("FD00::1",))))
    assert canonical.canonical and not written.canonical
    assert canonical.holding("fd00::1") == [(canonical.endpoints[0], "fd00::1")]
    assert written.holding("fd00::1") == [(written.endpoints[1], "FD00::1")]
    assert pickle.loads(pickle.dumps(written)).canonical is False


LOCATORS = [
    (("a", "p", ("10.1.0.1",), "n1", {"k": "v"}), ("10.1.0.1",)),
    (("a", "p", ("10.1.0.1", "fd00::1"), "n1", {"k": "v"}), ("10.1.0.1", "fd00::1")),
    (("t", "n1", (), "n1", {}, True, ("10.244.3.0/24",), "shop"), ()),
]


@pytest.mark.parametrize(("args", "addresses"), LOCATORS)
def test_locator_reads_back_what_it_was_given(
    args: tuple[object, ...], addresses: tuple[str, ...]
) -> None:
    loc = PodLocator(*args)  # type: ignore[arg-type]
    assert loc.addresses == addresses
    assert (loc.namespace, loc.name, loc.node_name, loc.node_labels) == (
        args[0],
        args[1],
        args[3],
        args[4],
    )
    assert loc.labels == {**args[4], NODE_NAME: args[3]}  # type: ignore[dict-item]
    same = PodLocator(*args)  # type: ignore[arg-type]
    assert loc == same and hash(loc) == hash(same)
    copy = pickle.loads(pickle.dumps(loc, pickle.HIGHEST_PROTOCOL))
    assert copy == loc and copy.labels == loc.labels
    assert loc.replace() == loc and loc.replace(name="q") != loc
    assert loc.replace(addresses=("10.9.0.1",)).addresses == ("10.9.0.1",)
    assert repr(loc).startswith(f"PodLocator(namespace={args[0]!r}, name=")
    with pytest.raises(FrozenInstanceError):
        loc.name = "q"


def test_locator_differs_in_any_field_but_its_derived_labels() -> None:
    base = PodLocator("a", "p", ("10.1.0.1",), "n1", {"k": "v"}, False, (), "shop")
    others = [
        base.replace(namespace="b"),
        base.replace(name="q"),
        base.replace(addresses=("10.1.0.2",)),
        base.replace(addresses=()),
        base.replace(node_name="n2"),
        base.replace(node_labels={"k": "w"}),
        base.replace(is_node=True),
        base.replace(cidrs=("10.244.3.0/24",)),
        base.replace(pod_namespace=""),
    ]
    assert all(base != other for other in others)
    assert base.namespace_of_pod == "shop" and others[-1].namespace_of_pod == "a"
