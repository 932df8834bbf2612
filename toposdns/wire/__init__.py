"""The DNS wire format: decoding queries and encoding replies."""
