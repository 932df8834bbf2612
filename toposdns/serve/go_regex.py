"""Go's regular expressions, as RE2 compiles them (google-re2), for `rewrite` and `template`.

RE2 is imported with the first pattern compiled: a Corefile without regexes, as most are,
never loads it (0.5 MB in a serving process; 2.5 MB where nothing else loaded the C++
runtime it needs)."""

from __future__ import annotations

import functools
from typing import Any


class PatternError(ValueError):
    """A pattern RE2 refuses; its message is RE2's reason."""


@functools.lru_cache(maxsize=4096)
def go_regex(pattern: str) -> Any:
    """`pattern` compiled as Go's regexp compiles it; PatternError when RE2 cannot."""
    import re2  # here, not above: see the module's docstring

    settings = re2.Options()
    settings.log_errors = False
    try:
        return re2.compile(pattern, settings)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise PatternError(str(reason)) from None
