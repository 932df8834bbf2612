"""Slim records of Kubernetes objects and the immutable snapshot built from them."""
