"""Batched UDP datagrams: recvmmsg(2) and sendmmsg(2) (the C extension datagrams.c)."""

from typing import Any

class Datagrams:
    """Batched UDP reads and writes on a socket's file descriptor, which the caller keeps open."""

    fd: int
    slots: int
    dropped: int
    last_error: int
    def __init__(self, fd: int, family: int, slots: int = 32) -> None: ...
    def recv(self) -> list[tuple[bytes, Any]]: ...
    def sendto(self, data: bytes, address: Any) -> None: ...
    def flush(self) -> int: ...
