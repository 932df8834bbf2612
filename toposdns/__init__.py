"""toposdns: cluster DNS that answers like CoreDNS, with topology-aware headless services."""

__version__ = "0.1.0"
