"""Kubernetes naming rules (toposdns/kube/names.py): apimachinery's IsQualifiedName with the API
server's messages, word for word, and the controller's `--node-label-keys` check, which uses it.
"""

from __future__ import annotations

import pytest

from toposdns.config import ConfigError
from toposdns.controller.config import check_label_key
from toposdns.kube.names import is_dns_label, is_dns_subdomain, qualified_name_errors

NAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
QUALIFIED_MSG = (
    f"a qualified name {NAME_MSG} with an optional DNS subdomain prefix and '/' "
    "(e.g. 'example.com/MyName')"
)
NAME_64 = "a" * 64
PREFIX_254 = "a" * 254

# IsQualifiedName: every message, in order. It checks the name part even after a bad prefix,
# and an empty name part fails both the emptiness and the regex check.
QUALIFIED_NAME_CASES = [
    ("kubernetes.io/hostname", []),
    ("topology.kubernetes.io/zone", []),
    ("example.com/My_Name.1", []),
    ("plain", []),
    ("a" * 63, []),
    ("a" * 253 + "/x", []),
    ("", ["name part must be non-empty", f"name part {NAME_MSG}"]),
    ("a/b/c", [QUALIFIED_MSG]),
    ("-bad", [f"name part {NAME_MSG}"]),
    ("Example.com/x", [f"prefix part {SUBDOMAIN_MSG}"]),
    (NAME_64, ["name part must be no more than 63 characters"]),
    ("-" + "a" * 63, ["name part must be no more than 63 characters", f"name part {NAME_MSG}"]),
    (PREFIX_254 + "/x", ["prefix part must be no more than 253 characters"]),
    ("/x", ["prefix part must be non-empty"]),
    ("example.com/", ["name part must be non-empty", f"name part {NAME_MSG}"]),
    ("Example.com/-bad", [f"prefix part {SUBDOMAIN_MSG}", f"name part {NAME_MSG}"]),
    (
        "/",
        ["prefix part must be non-empty", "name part must be non-empty", f"name part {NAME_MSG}"],
    ),
]


@pytest.mark.parametrize(
    "key, expected",
    QUALIFIED_NAME_CASES,
    ids=[k[:40] or "<empty>" for k, _ in QUALIFIED_NAME_CASES],
)
def test_qualified_name_errors(key: str, expected: list[str]) -> None:
    assert qualified_name_errors(key) == expected


@pytest.mark.parametrize(
    "key, expected",
    QUALIFIED_NAME_CASES,
    ids=[k[:40] or "<empty>" for k, _ in QUALIFIED_NAME_CASES],
)
def test_label_key_flags_take_exactly_the_qualified_names(key: str, expected: list[str]) -> None:
    if expected:
        with pytest.raises(ConfigError, match="--node-label-keys .*: not a label key"):
            check_label_key(key, "--node-label-keys")
    else:
        assert check_label_key(key, "--node-label-keys") == key


@pytest.mark.parametrize(
    "name, label, subdomain",
    [
        ("toposdns", True, True),
        ("kube-system", True, True),
        ("a" * 63, True, True),
        ("a" * 64, False, True),
        ("a." * 126 + "a", False, True),
        ("a." * 126 + "ab", False, False),
        ("example.com", False, True),
        ("", False, False),
        ("-a", False, False),
        ("a-", False, False),
        ("Upper", False, False),
        ("under_score", False, False),
        ("a..b", False, False),
    ],
)
def test_dns_labels_and_subdomains(name: str, label: bool, subdomain: bool) -> None:
    assert is_dns_label(name) is label
    assert is_dns_subdomain(name) is subdomain
