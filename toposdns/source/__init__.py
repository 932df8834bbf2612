"""Where objects come from: a snapshot file, or a list/watch of the Kubernetes API."""
