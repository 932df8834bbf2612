"""How a setting is declared, read and checked, for flags and the Corefile alike.

Each plugin keeps, next to its code, one frozen options dataclass (the only copy of its
defaults) and a `Plugin` table of its `Setting`s: the option's Corefile word, the flag that
spells it on the command line, and how its words become a value. A flag's value is split on
commas into words; a Corefile line is already words. Either way the same parser gets the words
and an `Origin` (the flag, or the file and line), so that an error says where it was made:

    --ttl 3601: must be between 0 and 3600
    Corefile:7: ttl 3601: must be between 0 and 3600

The validators below are the ones plugins share: numbers, durations, sizes, names, addresses.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from toposdns.wire.codes import Name

T = TypeVar("T")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: A domain name's label and whole-name limits (RFC 1035 section 2.3.4).
MAX_LABEL = 63


class ConfigError(ValueError):
    """A setting that cannot work, with where it was made and what to do about it."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a value came from: a flag (`--ttl`), or a Corefile's `file:line` and its option."""

    #: The option as the user spelled it: `--ttl`, or `ttl` in a Corefile block.
    option: str
    #: The value as written: the flag's argument, or the line's words after the option.
    text: str = ""
    #: `file:line` in a Corefile; empty for a flag.
    place: str = ""

    def __str__(self) -> str:
        shown = f"{self.option} {self.text}" if self.text else self.option
        return f"{self.place}: {shown}" if self.place else shown

    def error(self, message: str) -> ConfigError:
        """An error about this value: `<where> <value>: <message>`."""
        return ConfigError(f"{self}: {message}")


Parse = Callable[[Sequence[str], Origin], Any]
Apply = Callable[[T, Sequence[str], Origin], T]


@dataclass(frozen=True, slots=True)
class Setting(Generic[T]):
    """One option of a plugin: where it is written and how it changes the options object."""

    #: Its word in the plugin's Corefile block; "" for the directive's own arguments
    #: (`kubernetes ZONES`, `cache TTL`), `*` for the lines of its block that begin with no
    #: other setting's word (`hosts` entries: the line's first word is then one of its words),
    #: None when no Corefile spells it (a flag only).
    word: str | None
    #: How its words change the options: `sets(field, parse)` for most.
    apply: Apply[T]
    #: Its `toposdns serve` flag ("" for none), with the value's name and a help line, in which
    #: `{default}` is the default of `shows`, a field of the options.
    flag: str = ""
    metavar: str = ""
    help: str = ""
    shows: str = ""
    #: The flag may be given again: "join" applies the words of all at once, "each" applies
    #: each in turn.
    repeat: str = ""
    #: The flag's value may be left out (its words are then none).
    optional: bool = False
    #: The flag's value as words (default: its comma-separated parts).
    flag_words: Callable[[str], list[str]] | None = None

    def words_of_flag(self, value: str | None) -> list[str]:
        """The words a flag's value stands for (a flag without a value: none)."""
        if value is None:
            return []
        if self.flag_words is not None:
            return self.flag_words(value)
        return [part.strip() for part in value.split(",") if part.strip()]


@dataclass(frozen=True, slots=True)
class Plugin(Generic[T]):
    """A plugin's options object and its settings, as CoreDNS's `setup.go` reads a block."""

    #: The Corefile directive, and the field of the server's configuration holding the options.
    name: str
    options: type[T]
    settings: tuple[Setting[T], ...]
    #: Checks between settings, made once all are read (the origin names the directive).
    check: Callable[[T, Origin], T] | None = None
    #: The directive whose block the settings are written in, if not `name`'s own.
    directive: str = ""

    def default(self) -> T:
        """The options with every default."""
        return self.options()

    def setting(self, word: str) -> Setting[T] | None:
        """The setting a Corefile word names in this plugin's block."""
        return next((s for s in self.settings if s.word == word), None)

    def words(self) -> list[str]:
        """The words its block takes, for error messages."""
        return [s.word for s in self.settings if s.word and s.word != "*"]

    def finish(self, options: T, origin: Origin) -> T:
        """The options after the checks between settings."""
        return options if self.check is None else self.check(options, origin)

    def default_text(self, field: str) -> str:
        """A field's default as a help line shows it."""
        return show(getattr(self.default(), field))


def sets(field: str, parse: Parse) -> Apply[Any]:
    """A setting that sets one field to its parsed value."""

    def apply(options: Any, words: Sequence[str], origin: Origin) -> Any:
        return replace(options, **{field: parse(words, origin)})

    return apply


def adds(field: str, parse: Parse) -> Apply[Any]:
    """A setting that adds its parsed values (a tuple) to those a field has."""

    def apply(options: Any, words: Sequence[str], origin: Origin) -> Any:
        return replace(options, **{field: getattr(options, field) + parse(words, origin)})

    return apply


def field_default(options: type[Any], name: str) -> Any:
    """A dataclass field's default."""
    for item in fields(options):
        if item.name == name:
            if item.default is not MISSING:
                return item.default
            if item.default_factory is not MISSING:
                return item.default_factory()
    raise KeyError(name)


def show(value: object) -> str:
    """A value as help lines and messages show it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple) and value and all(isinstance(item, str) for item in value):
        return ".".join(value)  # a domain name's labels
    if isinstance(value, tuple):
        return ", ".join(show(item) for item in value) or "none"
    if isinstance(value, frozenset):
        return ", ".join(sorted(map(str, value))) or "none"
    return str(value)


# ----- the shared validators: (words, origin) -> value


def one(words: Sequence[str], origin: Origin, example: str) -> str:
    """The single word an option takes."""
    if len(words) != 1:
        raise origin.error(f"expected one value, e.g. {example}")
    return words[0]


def none(words: Sequence[str], origin: Origin) -> bool:
    """An option that takes no value (a switch): on."""
    if words:
        raise origin.error("takes no value")
    return True


def integer(low: int, high: int, example: str = "") -> Parse:
    """A whole number from `low` to `high`."""

    def parse(words: Sequence[str], origin: Origin) -> int:
        word = one(words, origin, example or str(low))
        try:
            value = int(word)
        except ValueError:
            raise origin.error(f"expected a whole number, e.g. {example or low}") from None
        return check_range(value, low, high, origin)

    return parse


def check_range(value: int, low: int, high: int, origin: Origin, what: str = "") -> int:
    """`value` if from `low` to `high`, else an error naming what is out of range."""
    if not low <= value <= high:
        raise origin.error(f"{what + ' ' if what else ''}must be between {low} and {high}")
    return value


def seconds(low: float = 0.001, high: float = 3600.0) -> Parse:
    """A time: a number of seconds, or a duration (`500ms`, `5s`, `1m`)."""

    def parse(words: Sequence[str], origin: Origin) -> float:
        value = _duration(one(words, origin, "5s"), origin)
        if not low <= value <= high:
            raise origin.error(f"must be between {low:g} and {high:g} seconds")
        return value

    return parse


def duration_value(text: str, origin: Origin) -> float:
    """Seconds from `5`, `5s`, `500ms`, `1m`, `2h45m` (Go's durations, as CoreDNS reads them)."""
    value = _duration(text, origin)
    if value < 0:
        raise origin.error("must not be negative")
    return value


def _duration(text: str, origin: Origin) -> float:
    """Seconds from a plain number or a Go duration: numbers each with its unit (`1.5h`,
    `2h45m`, `300ms`, `10us`), an optional sign before them."""
    try:
        value: float | None = float(text)  # seconds
    except ValueError:
        value = _go_duration(text)
    if value is None or not math.isfinite(value):
        raise origin.error("expected a duration such as 5s or 500ms")
    return value


#: Go's duration units, in seconds.
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
_GO_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def _go_duration(text: str) -> float | None:
    """Seconds from Go's `time.ParseDuration` form; None when it is not one."""
    body = text[1:] if text[:1] in "+-" else text
    parts = _GO_PART.findall(body)
    if not body or "".join(number + unit for number, unit in parts) != body:
        return None
    total = sum(float(number) * _UNITS[unit] for number, unit in parts)
    return -total if text.startswith("-") else total


def go_duration(text: str, origin: Origin, example: str = "5s") -> float:
    """Seconds from a duration as Go's `time.ParseDuration` reads it, where CoreDNS does: each
    number with its unit (`30s`, `1h20m`, `100ms`), a sign before them; a bare `0` is the only
    number without one (`20` is refused, as by CoreDNS)."""
    unsigned = text[1:] if text[:1] in ("+", "-") else text
    value = 0.0 if unsigned == "0" else _go_duration(text)
    if value is None or not math.isfinite(value):
        raise origin.error(f"{text!r} is not a duration: a number and its unit, e.g. {example}")
    return value


def size(words: Sequence[str], origin: Origin) -> int:
    """Bytes from `1048576`, `512Ki`, `64Mi` or `1Gi` (Kubernetes quantity suffixes)."""
    text = one(words, origin, "64Mi")
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    number, scale = text, 1
    if text[-2:] in units:
        number, scale = text[:-2], units[text[-2:]]
    if not number.isdigit() or int(number) == 0:
        raise origin.error("expected a size such as 64Mi, 512Ki or 1048576")
    return int(number) * scale


def choice(*allowed: str) -> Parse:
    """One of a few words."""

    def parse(words: Sequence[str], origin: Origin) -> str:
        word = one(words, origin, allowed[0])
        if word not in allowed:
            raise origin.error(f"expected one of {', '.join(allowed)}")
        return word

    return parse


def domain(text: str, origin: Origin) -> Name:
    """A domain name as lower-case labels; `.` is the root, ()."""
    return tuple(label.lower() for label in domain_as_written(text, origin))


def domain_as_written(text: str, origin: Origin) -> Name:
    """A domain name's labels in the case written; `.` is the root, ()."""
    if text == ".":
        return ()
    labels = tuple(text.rstrip(".").split("."))
    if any(not label or len(label) > MAX_LABEL for label in labels):
        raise origin.error(f"{text!r} is not a domain name")
    return labels


def address(default_port: int = 53) -> Parse:
    """`HOST:PORT`, `[V6]:PORT` or `:PORT` as (host, port); port 0 picks a free one."""

    def parse(words: Sequence[str], origin: Origin) -> tuple[str, int]:
        return address_value(one(words, origin, f"127.0.0.1:{default_port}"), origin)

    return parse


def address_value(text: str, origin: Origin) -> tuple[str, int]:
    """One `HOST:PORT`, `[V6]:PORT` or `:PORT`."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise origin.error("expected HOST:PORT, e.g. 127.0.0.1:5353")
    host = host.strip("[]") or "0.0.0.0"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise origin.error(f"{host!r} is not an IP address") from None
    return host, int(port_text)


def file(example: str) -> Parse:
    """One file's path."""

    def parse(words: Sequence[str], origin: Origin) -> Path:
        if len(words) != 1:
            raise origin.error(f"expected one file, e.g. {example}")
        return Path(words[0])

    return parse


def networks(words: Sequence[str], origin: Origin) -> tuple[Network, ...]:
    """CIDRs (an address alone is a /32 or /128)."""
    found = []
    for word in words:
        try:
            found.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            raise origin.error(f"{word!r} is not a CIDR, e.g. 10.244.0.0/16") from None
    return tuple(found)
