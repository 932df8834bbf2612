"""Where objects come from: a snapshot file (and, later, the Kubernetes API)."""
