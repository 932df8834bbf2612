"""The store's records: an Endpoint, held compactly, behaves as the frozen value it was."""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError, replace

import pytest

from toposdns.store.model import Endpoint, EndpointSlice, Port

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
