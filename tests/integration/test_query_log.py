"""CoreDNS's `log` (`--query-log`): a line on stdout per query, in CoreDNS's common log format,
whichever path answered it: the UDP fast path, the caches, TCP."""

from __future__ import annotations

import re
from pathlib import Path

from tests.integration.support import STOP_TIMEOUT, Server, copy_snapshot, dig, wait_until

#: plugin/log's CommonLogFormat: {remote}:{port} - {>id} "{type} {class} {name} {proto} {size}
#: {>do} {>bufsize}" {rcode} {>rflags} {rsize} {duration}
LINE = re.compile(
    r'\[INFO\] 127\.0\.0\.1:(\d+) - (\d+) "(\S+) IN (\S+) (udp|tcp) (\d+) (true|false) (\d+)" '
    r"(\S+) ([a-z,]+) (\d+) (\d+(\.\d+)?)s"
)


def test_a_line_per_query_in_coredns_common_format(tmp_path: Path) -> None:
    out = tmp_path / "stdout"
    # The server's stdout into a file (the harness reads only its stderr).
    wrapper = ("sh", "-c", 'exec "$@" >"$0"', str(out))
    server = Server(copy_snapshot(tmp_path), ("--query-log",), wrapper=wrapper)
    try:
        server.wait_ready()
        for _ in range(2):  # built, then from the UDP fast path
            dig(server, "web.shop.svc.cluster.local", "+noedns")
        dig(server, "NOTHING.shop.svc.cluster.local", "+tcp", "+bufsize=1232", "+dnssec")
        assert wait_until(lambda: len(out.read_text().splitlines()) >= 3, 5), out.read_text()
        lines = out.read_text().splitlines()
        assert len(lines) == 3, lines
        found = [LINE.fullmatch(line) for line in lines]
        assert all(found), lines
        fields = [m.groups()[2:11] for m in found if m]
        name = "web.shop.svc.cluster.local."
        want = ("A", name, "udp", "44", "false", "512", "NOERROR", "qr,aa,rd")
        assert fields[0][:8] == want  # 44 bytes: the header, the name, type and class
        assert fields[1] == fields[0]  # the fast path's line is the same
        assert fields[2][:8] == (
            "A", "nothing.shop.svc.cluster.local.", "tcp", fields[2][3], "true", "65535",
            "NXDOMAIN", "qr,aa,rd",
        )  # fmt: skip
    finally:
        assert server.stop(STOP_TIMEOUT) == 0, server.log()
