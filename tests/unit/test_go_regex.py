"""Go's regexes through RE2: compiled as Go compiles them, refused with RE2's reason, and RE2
loaded only by a Corefile that has a regex."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.server_process import REPO
from toposdns.serve.go_regex import PatternError, go_regex

#: (pattern, a name it must find, a name it must not), as Go's regexp matches them.
MATCHES = [
    (r"^(\w+)\.example\.org\.$", "web.example.org.", "web.example.net."),
    (r"(?i)^WEB\.", "web.shop.", "api.shop."),
    (r"^[a-z]+-[0-9]{1,3}\.", "db-12.shop.", "db-1234.shop."),
]


@pytest.mark.parametrize(("pattern", "found", "missed"), MATCHES)
def test_patterns_match_as_go_matches(pattern: str, found: str, missed: str) -> None:
    compiled = go_regex(pattern)
    assert compiled.search(found) is not None and compiled.search(missed) is None


@pytest.mark.parametrize("pattern", [r"(a", r"(?<=a)b", r"a{2,1}", r"\8"])
def test_a_pattern_re2_refuses_says_why(pattern: str) -> None:
    with pytest.raises(PatternError) as refused:
        go_regex(pattern)
    assert str(refused.value)  # RE2's reason, e.g. "missing ): (a"


def test_re2_is_loaded_by_the_first_pattern_only() -> None:
    check = (
        "import sys, toposdns.cli, toposdns.server, toposdns.serve.rewrite, "
        "toposdns.serve.template\n"
        "assert 're2' not in sys.modules, 'loaded without a pattern'\n"
        "from toposdns.serve.go_regex import go_regex\n"
        "go_regex('^a')\n"
        "assert 're2' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
