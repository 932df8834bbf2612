"""toposdns: cluster DNS that answers like CoreDNS, with topology-aware headless services."""

import os

__version__ = "0.1.0"

#: The environment variable the image sets to the git commit it was built from (the Dockerfile's
#: build argument REVISION).
REVISION_VARIABLE = "TOPOSDNS_REVISION"


def build_revision() -> str:
    """The git commit this build came from, as `coredns_build_info{revision}` shows it; empty
    for a build that was given none (a source checkout, `pip install`)."""
    return os.environ.get(REVISION_VARIABLE, "").strip()[:64]
