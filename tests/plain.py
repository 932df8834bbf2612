"""Run pytest on the plain-Python form of this tree: `python -m tests.plain [pytest args]`.

The source tree holds the compiled modules (.so files next to the .py files, which Python
prefers), so the plain form is a copy of the tree without them, in a temporary directory; the
tests run there with TOPOSDNS_COMPILE=no, which makes them check that nothing compiled is
loaded (tests/build_form.py). The README's test command runs the unit tests this way, after
the whole suite on the compiled form.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.build_form import copy_plain


def main(args: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="toposdns-plain-") as directory:
        tree = copy_plain(Path(directory))
        print(f"plain Python: python -m pytest {' '.join(args)} in a copy at {tree}", flush=True)
        environment = {**os.environ, "TOPOSDNS_COMPILE": "no"}
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
        return subprocess.run(command, cwd=tree, env=environment, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
