"""Kubernetes naming rules, as apimachinery's validation package checks them; no I/O.

`qualified_name_errors` returns the API server's own messages, word for word, because they reach
operators in logs and `explain` next to what `kubectl` would say.
"""

from __future__ import annotations

import re

_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_MESSAGE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)


def is_dns_label(value: str) -> bool:
    """apimachinery's IsDNS1123Label: a namespace name, for instance."""
    return len(value) <= 63 and bool(_DNS1123_LABEL.fullmatch(value))


def is_dns_subdomain(value: str) -> bool:
    """apimachinery's IsDNS1123Subdomain: most object names, and label key prefixes."""
    return len(value) <= 253 and bool(_DNS1123_SUBDOMAIN.fullmatch(value))


def qualified_name_errors(value: str) -> list[str]:
    """apimachinery's IsQualifiedName: `[prefix/]name`, as label keys are. Errors accumulate."""
    parts = value.split("/")
    if len(parts) > 2:
        return [
            f"a qualified name {_NAME_MESSAGE} with an optional DNS subdomain prefix and '/' "
            "(e.g. 'example.com/MyName')"
        ]
    errors = []
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            if len(prefix) > 253:
                errors.append("prefix part must be no more than 253 characters")
            if not _DNS1123_SUBDOMAIN.fullmatch(prefix):
                errors.append(f"prefix part {_SUBDOMAIN_MESSAGE}")
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    if not _NAME_PART.fullmatch(name):
        errors.append(f"name part {_NAME_MESSAGE}")
    return errors
