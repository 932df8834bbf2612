"""CoreDNS's `hosts`: A, AAAA and PTR answers from a hosts file and from entries in the Corefile.

    hosts [FILE [ZONES...]] {
        [INLINE]
        ttl SECONDS
        no_reverse
        reload DURATION
        fallthrough [ZONES...]
        fallthrough_unsupported
    }

As CoreDNS 1.14's plugin/hosts (hostsfile.go, hosts.go, setup.go):

- **Entries** are `ADDRESS NAME...` lines, from FILE (default /etc/hosts) and from the lines of
  the block that start with no option word (INLINE, written before `fallthrough`); both are
  served, the file's first. `#` starts a comment. A line whose first word is not an IP address,
  or that has no name, is skipped; an IPv6 zone (`fe80::1%lo0`) is dropped; an IPv4-mapped
  IPv6 address (`::ffff:10.0.0.2`) is an IPv4 one. Names are lower-cased and kept only inside
  the plugin's ZONES (default: the server block's). A name listed again, or with an address
  listed twice, answers each address as often as it is listed. `*.example.com` stands for every
  name one label below example.com (not the apex, not deeper) that has no entry of its own.
- **Answers** are authoritative, with `ttl` (default 3600), their owner name in lower case. A
  name with addresses of the other family only, or asked another type than A or AAAA, gets
  NODATA (no SOA: a hosts file has none). A name without entries goes to the next plugin in a
  `fallthrough` zone, else gets SERVFAIL (CoreDNS cannot deny without a SOA). A name outside
  ZONES always goes to the next plugin.
- **PTR** answers come from the entries' addresses (not from wildcards, nor with `no_reverse`),
  whatever ZONES say; an address without names always goes to the next plugin.
- `fallthrough_unsupported` sends the other query types to the next plugin too, in the
  `fallthrough` zones.
- **Reload**: every `reload` (default 5s; 0: never) the file is read again if its modification
  time or size changed. A file that cannot be read keeps the entries last read from it; the
  inline ones are served whatever happens to the file.

Bounded: a file over `MAX_FILE_BYTES` is not read (one log line; the entries last read stay),
at most `MAX_ENTRIES` entries are kept from each source, a line over 64 KiB is skipped, and the
file is checked at most every `MIN_RELOAD` seconds. Left out, as no query can reach them:
names CoreDNS keeps but never matches (characters a query name shows escaped, empty or
over-long labels). ZONES that are neither names nor CIDRs are refused rather than ignored.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from toposdns.metrics import HOSTS_ENTRIES, HOSTS_RELOAD_TIMESTAMP
from toposdns.options import Origin, Plugin, Setting, domain, duration_value, integer, none, sets
from toposdns.resolve.answer import Answer
from toposdns.serve.chain import Next, Reply, Request
from toposdns.wire.codes import AAAA, NOERROR, PTR, SERVFAIL, A, Name
from toposdns.wire.encode import encode_bare, encode_reply
from toposdns.wire.records import RR

log = logging.getLogger("toposdns")

#: A hosts file is read whole, and more than this is a mistake (a node's names take a few
#: hundred bytes; ad-blocking lists of 100,000 names about 3 MiB).
MAX_FILE_BYTES = 4 << 20
#: Names kept from one source, a name with two addresses counted twice: about 200 bytes each
#: (30 MiB at most), read in about a second of CPU.
MAX_ENTRIES = 150_000
#: CoreDNS's file reader (bufio.Scanner) stops at a longer line; here it is skipped.
MAX_LINE = 64 << 10
#: The shortest time between two looks at the file, whatever `reload` says.
MIN_RELOAD = 0.1
#: More records than this never fit in one message (64 KiB, 14 bytes or more each): an
#: answer is cut here before it is encoded, to bound what one query costs.
MAX_RECORDS = 65535 // 14
#: CoreDNS's `ttl` bounds.
MAX_TTL = 65535
#: How many lines a log line names when some are skipped.
SHOWN = 3

#: Letter case folded as DNS folds it: ASCII only.
_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
#: What no name of an entry may hold: what a query name shows escaped (miekg/dns's
#: presentation form, which CoreDNS compares entries with, so that they would never answer).
_ESCAPED = re.compile(r"[^!-~]|['@;()\"\\]")


class Inline(NamedTuple):
    """An entry line written in the Corefile, and where."""

    text: str
    place: str


@dataclass(frozen=True, slots=True)
class HostsOptions:
    """CoreDNS's `hosts`, as a server block's directive sets it."""

    #: True when the server block has `hosts`.
    enabled: bool = False
    #: FILE: read, and read again when it changes, as well as the inline entries.
    path: Path = Path("/etc/hosts")
    #: ZONES, lower case: the names it answers (none given: the server block's zones).
    zones: tuple[Name, ...] = ()
    #: The entries written in the Corefile, in order.
    inline: tuple[Inline, ...] = ()
    #: The TTL of every record it answers.
    ttl: int = 3600
    #: Seconds between two looks at the file; 0: it is read once.
    reload: float = 5.0
    #: PTR records from the entries (`no_reverse`: none).
    reverse: bool = True
    #: `fallthrough` zones: a name there without entries goes to the next plugin (`()`, the
    #: root, holds every name; none: SERVFAIL).
    fallthrough: tuple[Name, ...] = ()
    #: `fallthrough_unsupported`: other types than A, AAAA and PTR go on in those zones too.
    fallthrough_unsupported: bool = False


def zones_of(words: Sequence[str], origin: Origin) -> tuple[Name, ...]:
    """Zones as CoreDNS's `plugin.Host.NormalizeExact` reads them: names, lower case (a
    `dns://` before and a `:PORT` after are dropped), or CIDRs, which stand for their reverse
    zones (`10.0.0.0/8`: 10.in-addr.arpa)."""
    found: list[Name] = []
    for word in words:
        text = word.removeprefix("dns://")
        host, colon, port = text.rpartition(":")
        if colon and port.isdigit():
            text = host
        if "/" in text:
            try:
                network = ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise origin.error(
                    f"{word!r} is neither a zone nor a CIDR, e.g. 10.0.0.0/8"
                ) from None
            found.extend(reverse_zones(network))
        else:
            found.append(domain(text, origin))
    return tuple(dict.fromkeys(found))


def reverse_zones(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> list[Name]:
    """The reverse zones that hold a network's addresses: itself widened to a whole label (8
    bits for IPv4, 4 for IPv6) when it is one, else each of its subnets that is (at most 128),
    as CoreDNS's `cidr.Split` and `cidr.Reverse`."""
    step = 8 if network.version == 4 else 4
    whole = math.ceil(network.prefixlen / step) * step
    subnets = [network] if whole == network.prefixlen else network.subnets(new_prefix=whole)
    zones = []
    for subnet in subnets:
        labels = subnet.network_address.reverse_pointer.split(".")
        zones.append(tuple(labels[(subnet.max_prefixlen - whole) // step :]))
    return zones


def _arguments(options: HostsOptions, words: Sequence[str], origin: Origin) -> HostsOptions:
    """`hosts [FILE [ZONES...]]`."""
    path = Path(words[0]) if words else options.path
    return replace(options, enabled=True, path=path, zones=zones_of(words[1:], origin))


def _reload(words: Sequence[str], origin: Origin) -> float:
    if len(words) != 1:
        raise origin.error("expected one duration (0 to read the file once), e.g. reload 15s")
    return duration_value(words[0], origin)


def _no_reverse(options: HostsOptions, words: Sequence[str], origin: Origin) -> HostsOptions:
    return replace(options, reverse=not none(words, origin))


def _fallthrough(words: Sequence[str], origin: Origin) -> tuple[Name, ...]:
    """`fallthrough [ZONES...]`: no zone is every zone, the root."""
    return zones_of(words, origin) if words else ((),)


def _inline(options: HostsOptions, words: Sequence[str], origin: Origin) -> HostsOptions:
    """An entry line (`10.0.0.1 example.org`), which CoreDNS takes only before `fallthrough`."""
    if options.fallthrough:
        raise origin.error(
            f"unknown property {words[0]!r}: write the entries before fallthrough, as CoreDNS "
            "requires"
        )
    return replace(options, inline=(*options.inline, Inline(" ".join(words), origin.place)))


def _check(options: HostsOptions, origin: Origin) -> HostsOptions:
    """`fallthrough_unsupported` needs `fallthrough`; a file that is missing is only logged (it
    may appear), one that cannot be looked at is refused, as by CoreDNS's setup."""
    if not options.enabled:
        return options
    if options.fallthrough_unsupported and not options.fallthrough:
        raise origin.error("fallthrough_unsupported requires fallthrough; add `fallthrough`")
    try:
        options.path.stat()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise origin.error(
            f"unable to access hosts file {str(options.path)!r}: {exc.strerror or exc}"
        ) from None
    return options


HOSTS: Plugin[HostsOptions] = Plugin(
    "hosts",
    HostsOptions,
    (
        Setting("", _arguments),
        Setting("ttl", sets("ttl", integer(1, MAX_TTL, "60"))),
        Setting("reload", sets("reload", _reload)),
        Setting("no_reverse", _no_reverse),
        Setting("fallthrough", sets("fallthrough", _fallthrough)),
        Setting("fallthrough_unsupported", sets("fallthrough_unsupported", none)),
        Setting("*", _inline),
    ),
    check=_check,
)


class Entries(NamedTuple):
    """The entries of one source (the file, or the Corefile), as lookups read them. Names are
    dotted, lower case, without the final dot; addresses in their canonical text."""

    v4: dict[str, list[str]]
    v6: dict[str, list[str]]
    #: Wildcard names (`*.example.com`) to their addresses.
    wild4: dict[str, list[str]]
    wild6: dict[str, list[str]]
    #: Address to names, for PTR.
    names: dict[str, list[str]]
    #: CoreDNS's count (`Map.Len`): names with each address, and addresses with each name.
    size: int


EMPTY = Entries({}, {}, {}, {}, {}, 0)


class Parsed(NamedTuple):
    """Entries read from lines, and what was left out."""

    entries: Entries
    #: The numbers (from 1) of the lines skipped: no address first, or no name.
    skipped: list[int]
    #: The number of the line at which `MAX_ENTRIES` was reached (0: it was not).
    cut: int


def parse(lines: Iterable[bytes], zones: frozenset[Name], reverse: bool) -> Parsed:
    """Entries from hosts file lines, those outside `zones` left out."""
    v4: dict[str, list[str]] = {}
    v6: dict[str, list[str]] = {}
    wild4: dict[str, list[str]] = {}
    wild6: dict[str, list[str]] = {}
    names: dict[str, list[str]] = {}
    #: Each address's family and text, once per address written (they repeat).
    addresses: dict[bytes, tuple[bool, str] | None] = {}
    skipped: list[int] = []
    size = entries = 0
    every = () in zones
    for number, line in enumerate(lines, 1):
        if len(line) > MAX_LINE:
            skipped.append(number)
            continue
        comment = line.find(b"#")
        fields = (line[:comment] if comment >= 0 else line).split()
        if not fields:
            continue
        if fields[0] in addresses:
            address = addresses[fields[0]]
        else:
            address = addresses[fields[0]] = _address(fields[0])
        if address is None or len(fields) < 2:
            skipped.append(number)
            continue
        six, text = address
        for field in fields[1:]:
            name = _name(field.decode("latin-1"), zones, every)
            if name is None:
                continue
            if entries >= MAX_ENTRIES:
                return Parsed(Entries(v4, v6, wild4, wild6, names, size), skipped, number)
            entries += 1
            wild = name == "*" or name.startswith("*.")
            table = (wild6 if six else wild4) if wild else (v6 if six else v4)
            table.setdefault(name, []).append(text)
            size += 1
            if reverse and not wild:
                names.setdefault(text, []).append(name)
                size += 1
    return Parsed(Entries(v4, v6, wild4, wild6, names, size), skipped, 0)


def _address(word: bytes) -> tuple[bool, str] | None:
    """(IPv6?, canonical text) of an entry's address, its zone dropped; IPv4-mapped IPv6 is
    IPv4. None when it is not an address."""
    try:
        address = ipaddress.ip_address(word.partition(b"%")[0].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return False, str(address.ipv4_mapped)
    return address.version == 6, str(address)


def _name(raw: str, zones: frozenset[Name], every: bool) -> str | None:
    """An entry's name, dotted and lower case without the final dot ("" is the root); None
    when no query could ask it, or it is outside the zones."""
    if _ESCAPED.search(raw):
        return None
    name = raw.translate(_LOWER)
    name = name[:-1] if name.endswith(".") else name
    labels: Name = tuple(name.split(".")) if name else ()
    if any(not label or len(label) > 63 for label in labels) or len(name) > 253:
        return None
    if not every and not any(labels[start:] in zones for start in range(len(labels) + 1)):
        return None
    return name


class Read(NamedTuple):
    """What a look at the file found."""

    #: The file's modification time (ns) and size, as looked at.
    stamp: tuple[int, int] | None
    #: Its entries when it changed and was read; None when unchanged or not read.
    parsed: Parsed | None = None
    #: Why it was not read ("" when it was, or had not changed).
    problem: str = ""


def read_hosts(
    path: Path, stamp: tuple[int, int] | None, zones: frozenset[Name], reverse: bool
) -> Read:
    """The file's entries, unless its modification time and size are still `stamp`. Opened
    without blocking, so that a FIFO put in its place cannot hang the reader."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return Read(stamp, problem=f"cannot read it ({exc.strerror or exc})")
    try:
        status = os.fstat(fd)
        seen = (status.st_mtime_ns, status.st_size)
        if seen == stamp:
            return Read(stamp)
        if not stat.S_ISREG(status.st_mode):
            return Read(stamp, problem="not a regular file")
        if status.st_size > MAX_FILE_BYTES:
            return Read(stamp, problem=f"larger than {MAX_FILE_BYTES >> 20} MiB: not read")
        with open(fd, "rb", closefd=False) as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        return Read(stamp, problem=f"cannot read it ({exc.strerror or exc})")
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:  # it grew while read
        return Read(stamp, problem=f"larger than {MAX_FILE_BYTES >> 20} MiB: not read")
    lines = [line.removesuffix(b"\r") for line in data.split(b"\n")]
    return Read(seen, parse(lines, zones, reverse))


class Hosts:
    """CoreDNS's `hosts` handler: answers from its entries, passes the rest on."""

    name = "hosts"

    def __init__(self, options: HostsOptions, zones: tuple[Name, ...]) -> None:
        self.options = options
        self.ttl = options.ttl
        #: The zones it answers, and those it passes names without entries on in.
        self.zones = frozenset(options.zones or zones)
        self.fall = frozenset(options.fallthrough)
        self.unsupported = options.fallthrough_unsupported
        self.path = options.path
        self.inline = self.read_inline()
        self.file = EMPTY
        #: The file's modification time (ns) and size when it was last read.
        self.stamp: tuple[int, int] | None = None
        #: Why the file could not be read, as logged ("": it could).
        self.problem = ""
        #: Called when the file's entries change (the server drops the replies it cached).
        self.on_change: Callable[[], None] | None = None

    # ----- answering

    def serve(self, request: Request, next: Next) -> Reply:
        query = request.query
        lower = tuple(label.translate(_LOWER) for label in query.name)
        qtype = query.qtype
        if qtype == PTR:
            names = self.names_of(lower)
            if not names:
                return next(request)
            records = tuple(RR(lower, PTR, self.ttl, _labels(name)) for name in names)
            return self.answer(request, records)
        if not _within(lower, self.zones):
            return next(request)
        exact = None if any("." in label for label in lower) else ".".join(lower)
        wild = None
        if len(lower) > 1 and not any("." in label for label in lower[1:]):
            wild = "*." + ".".join(lower[1:])
        if qtype in (A, AAAA):
            found = self.addresses(exact, wild, qtype == AAAA)
        else:
            if self.unsupported and _within(lower, self.fall):
                return next(request)
            found = []
        if not found and not (
            self.addresses(exact, wild, False) or self.addresses(exact, wild, True)
        ):
            if _within(lower, self.fall):
                return next(request)
            return encode_bare(query, SERVFAIL)
        return self.answer(request, tuple(RR(lower, qtype, self.ttl, text) for text in found))

    def answer(self, request: Request, records: tuple[RR, ...]) -> bytes:
        """An authoritative answer (NODATA without records)."""
        return encode_reply(
            request.query,
            Answer(NOERROR, records),
            request.limit,
            request.transport.fragment_limit,
            0,
        )

    def addresses(self, exact: str | None, wild: str | None, six: bool) -> list[str]:
        """A name's addresses of one family: the file's, then the Corefile's; in each, those of
        the name, else of the wildcard one label above it."""
        found: list[str] = []
        for entries in (self.file, self.inline):
            table, wilds = (entries.v6, entries.wild6) if six else (entries.v4, entries.wild4)
            listed = table.get(exact) if exact is not None else None
            if listed is None and wild is not None:
                listed = wilds.get(wild)
            if listed:
                found.extend(listed[: MAX_RECORDS - len(found)])
        return found

    def names_of(self, lower: Name) -> list[str]:
        """The names of the address a reverse name stands for: the file's, then the
        Corefile's."""
        address = reverse_address(lower)
        if address is None:
            return []
        found: list[str] = []
        for entries in (self.file, self.inline):
            found.extend(entries.names.get(address, ())[: MAX_RECORDS - len(found)])
        return found

    # ----- the entries

    def read_inline(self) -> Entries:
        """The Corefile's entries; a line that is none is logged (CoreDNS skips it too)."""
        lines = [line.text.encode() for line in self.options.inline]
        parsed = parse(lines, self.zones, self.options.reverse)
        for number in parsed.skipped:
            line = self.options.inline[number - 1]
            log.warning(
                "%s: hosts: %r is neither an option nor an entry (ADDRESS NAME...); ignored, as "
                "CoreDNS ignores it",
                line.place,
                line.text,
            )
        if parsed.cut:
            log.warning(
                "%s: hosts: more than %d entries; the rest are ignored",
                self.options.inline[parsed.cut - 1].place,
                MAX_ENTRIES,
            )
        return parsed.entries

    def load(self) -> None:
        """Read the file now (at startup)."""
        self.apply(read_hosts(self.path, self.stamp, self.zones, self.options.reverse))
        self.report()

    async def watch(self) -> None:
        """Read the file again every `reload` when it has changed, for as long as the server
        serves; never raises (one log line per change of state)."""
        if self.options.reload <= 0:
            return
        interval = max(self.options.reload, MIN_RELOAD)
        while True:
            await asyncio.sleep(interval)
            await self.reload()

    async def reload(self) -> bool:
        """Look at the file, and read it if it changed (in a thread: the queries go on being
        answered meanwhile); True when its entries changed."""
        try:
            read = await asyncio.to_thread(
                read_hosts, self.path, self.stamp, self.zones, self.options.reverse
            )
        except Exception as exc:  # a fault here must not end the watch
            self.note(f"cannot read it ({exc!r})")
            return False
        changed = self.apply(read)
        if read.parsed is not None:
            self.report()
        if changed and self.on_change is not None:
            self.on_change()
        return changed

    def apply(self, read: Read) -> bool:
        """Take what a look at the file found; True when the entries changed."""
        if read.problem:
            self.note(read.problem)
            return False
        if read.parsed is None:
            return False
        self.stamp = read.stamp
        entries = read.parsed.entries
        changed = entries != self.file
        self.file = entries
        recovered = bool(self.problem)
        self.problem = ""
        if changed or recovered:
            log.info("hosts: %s: %s", self.path, _summary(read.parsed))
        return changed

    def note(self, problem: str) -> None:
        """Log a problem with the file once, until it changes."""
        if problem == self.problem:
            return
        self.problem = problem
        served = []
        if self.file.size:
            served.append(f"the {self.file.size} entries read from it before")
        if self.inline.size:
            served.append("the Corefile's")
        served_text = " and ".join(served) or "no entries"
        log.warning("hosts: %s: %s; serving %s", self.path, problem, served_text)

    def report(self) -> None:
        """coredns_hosts_entries and coredns_hosts_reload_timestamp_seconds, as CoreDNS sets
        them after a read."""
        HOSTS_ENTRIES.labels(str(self.path)).set(self.inline.size + self.file.size)
        if self.stamp is not None:
            HOSTS_RELOAD_TIMESTAMP.set(self.stamp[0] / 1e9)

    def forget(self) -> None:
        """Drop this handler's entries gauge (a reload replaced it)."""
        try:
            HOSTS_ENTRIES.remove(str(self.path))
        except KeyError:
            pass


def make_hosts(options: HostsOptions, zones: tuple[Name, ...]) -> Hosts | None:
    """The handler of a server block's `hosts`, its file read; None without one."""
    if not options.enabled:
        return None
    hosts = Hosts(options, zones)
    hosts.load()
    return hosts


def reverse_address(lower: Name) -> str | None:
    """The address a reverse name stands for, as CoreDNS's `dnsutil.ExtractAddressFromReverse`
    reads it, in the canonical text the entries use (an IPv4-mapped one as IPv4); None when it
    stands for none."""
    suffix = lower[-2:]
    if len(lower) < 3 or suffix not in (("in-addr", "arpa"), ("ip6", "arpa")):
        return None
    digits = lower[-3::-1]
    try:
        if suffix[0] == "in-addr":
            return str(ipaddress.IPv4Address(".".join(digits)))
        # Groups of four labels, as many as there are whole groups: only eight make an address.
        if len(digits) // 4 != 8 or any(len(digit) != 1 for digit in digits[:32]):
            return None
        text = ":".join("".join(digits[at : at + 4]) for at in range(0, 32, 4))
        address = ipaddress.IPv6Address(text)
    except ValueError:
        return None
    mapped = address.ipv4_mapped
    return str(mapped) if mapped is not None else str(address)


def _within(lower: Name, zones: frozenset[Name]) -> bool:
    """True if one of the zones holds the name."""
    return any(lower[start:] in zones for start in range(len(lower) + 1))


def _labels(name: str) -> Name:
    return tuple(name.split(".")) if name else ()


def _summary(parsed: Parsed) -> str:
    """How many entries a read found, and what it left out."""
    text = f"{parsed.entries.size} entries"
    if parsed.skipped:
        lines = ", ".join(map(str, parsed.skipped[:SHOWN]))
        more = ", ..." if len(parsed.skipped) > SHOWN else ""
        text += f"; {len(parsed.skipped)} lines skipped (not ADDRESS NAME...): {lines}{more}"
    if parsed.cut:
        text += f"; more than {MAX_ENTRIES} entries: those from line {parsed.cut} on ignored"
    return text
