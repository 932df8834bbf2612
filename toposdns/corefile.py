"""The Corefile, read as CoreDNS reads it, into the same configuration the flags build.

Syntax (CoreDNS's Caddyfile): words separated by blanks; `"quoted words"` with `\\"` inside;
`#` begins a comment; `{$NAME}` in a word is the environment variable NAME; a server block is
its keys (`.:53`, `cluster.local:53`, `dns://.:53`) then `{ ... }` (the braces may be left out
when there is one block); a directive is the first word of a line, its arguments the rest of
the line, and a `{` ending the line opens its block of options, one a line, closed by a `}` on
a line of its own. `(name) { ... }` at the top defines a snippet; `import name` pastes it, and
`import FILE` (a glob, relative to the Corefile's directory) pastes files.

Each directive goes to the plugin tables of toposdns/config.py, through the same settings and
validators as the flags. Everything else stops startup with one line: the file and line, the
word, and what is supported there.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from toposdns.config import BLOCK_PLUGINS, PLUGINS, Reading
from toposdns.options import ConfigError, Origin, Plugin, domain
from toposdns.serve.blocks import BlockConfig
from toposdns.serve.chain import ORDER
from toposdns.serve.forward import ForwardOptions
from toposdns.serve.forward_cache import cache_off
from toposdns.serve.http import PROMETHEUS
from toposdns.wire.codes import Name

#: A Corefile, and each file it imports, is small; more is a mistake in the path.
MAX_FILE_BYTES = 1 << 20
#: Imports inside imports, at most this deep (a snippet that imports itself stops here).
MAX_IMPORT_DEPTH = 10
#: Words in all, imports included.
MAX_TOKENS = 100_000

#: Directives read for their place in CoreDNS's chain but with nothing to set here: toposdns
#: logs errors once per state change (`errors`) and always guards against forwarding loops
#: when it forwards (`loop`).
ACCEPTED = {"errors": "errors are logged anyway", "loop": "loops are always detected"}


def _plugins_by_directive() -> dict[str, tuple[Plugin[Any], ...]]:
    """The directives toposdns reads, by name, with the plugins whose settings they hold (a
    plugin with a `directive` is written in that directive's block)."""
    found: dict[str, tuple[Plugin[Any], ...]] = {}
    for plugin in PLUGINS:
        name = plugin.directive or plugin.name
        found[name] = (*found.get(name, ()), plugin)
    return found


#: Directives a server block may hold more than once, as CoreDNS allows.
REPEATABLE = ("acl", "template", "rewrite")
#: The directives toposdns reads, by name.
DIRECTIVES = _plugins_by_directive()
SUPPORTED = sorted([*DIRECTIVES, *ACCEPTED])
#: The directives a server block without kubernetes may hold (a stub domain's), and those it
#: may hold when they say what the kubernetes block says (`_alongside`).
BLOCK_DIRECTIVES = sorted({plugin.directive or plugin.name for plugin in BLOCK_PLUGINS})
ALONGSIDE = ("log", "prometheus")
_ENV = re.compile(r"\{\$([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True, slots=True)
class Token:
    """A word of a Corefile, and where it was written."""

    text: str
    file: str
    line: int
    quoted: bool = False

    @property
    def place(self) -> str:
        return f"{self.file}:{self.line}"

    def error(self, message: str) -> ConfigError:
        return ConfigError(f"{self.place}: {self.text}: {message}")

    def is_(self, text: str) -> bool:
        """True for an unquoted `{`, `}` or other word of the syntax."""
        return not self.quoted and self.text == text


def read_corefile(path: Path, reading: Reading | None = None) -> Reading:
    """A Corefile read into the server's configuration (`reading`, or a new one), for flags to
    follow and `done()` to check; ConfigError names the file and line of what is wrong."""
    reading = reading or Reading()
    tokens = expand(lex(_read(path, None), str(path)), path.parent, {}, 0)
    blocks = server_blocks(tokens)
    if not blocks:
        raise ConfigError(f"{path}: no server block, e.g. .:53 {{ kubernetes cluster.local }}")
    main = [block for block in blocks if any(line[0].is_("kubernetes") for line, _ in block[1])]
    if not main:
        raise blocks[0][0][0].error("no kubernetes plugin in any server block: toposdns is one")
    if len(main) > 1:
        raise main[1][0][0].error(
            f"a second server block with kubernetes (the first is at line {main[0][0][0].line}):"
            " toposdns serves the cluster's zones from one block; list them all in it"
        )
    keys, lines = main[0]
    apply_block(reading, keys, lines)
    taken: dict[tuple[Where, Name], Token] = {(MAIN, zone): keys[0] for zone in reading.block_zones}
    for block in blocks:
        if block is not main[0]:
            reading.blocks.append(read_block(reading, *block, taken))
    return reading


#: Where a server block listens: its port and its own `bind` address; MAIN for the kubernetes
#: block's port and address.
Where = tuple[int | None, str | None]
MAIN: Where = (None, None)


def read_block(
    reading: Reading,
    key_tokens: list[Token],
    directives: list[tuple[Line, list[Line]]],
    taken: dict[tuple[Where, Name], Token],
) -> BlockConfig:
    """A server block beside the kubernetes one (a stub domain, on its port or another): its
    zones, port and plugins. `taken` holds the zones of each address read so far."""
    keys = [(key, token) for token in key_tokens for key in parse_key(token)]
    if len({key.port for key, _ in keys}) > 1:
        raise key_tokens[0].error("every key of the server block must have the same port")
    main = reading.options["bind"]
    port = keys[0][0].port
    block = Reading(BLOCK_PLUGINS)
    seen: dict[str, Token] = {}
    for line, body in directives:
        word = line[0]
        if word.text in seen and word.text not in REPEATABLE:
            raise word.error(
                f"given twice in the server block (first at line {seen[word.text].line})"
            )
        seen[word.text] = word
        if word.text in ACCEPTED:
            _accepted(line, body)
        elif word.text in ALONGSIDE:
            _alongside(reading, line, body)
        elif not word.quoted and word.text in BLOCK_DIRECTIVES:
            args = [token.text for token in line[1:]]
            plugins = [plugin for plugin in DIRECTIVES[word.text] if plugin in BLOCK_PLUGINS]
            _directive(block, plugins, word, args, body)
        else:
            supported = sorted([*BLOCK_DIRECTIVES, *ACCEPTED, *ALONGSIDE])
            raise word.error(
                f"not supported in a server block without kubernetes; supported there: "
                f"{', '.join(supported)}"
            )
    options = block.finished()
    bind = options["bind"].host if "bind" in seen else None
    if bind == main.host:
        bind = None
    if port == main.port and bind is not None:
        raise seen["bind"].error(
            f"a bind address of its own in a server block on the kubernetes block's port "
            f"{port}: toposdns serves that port's blocks on the kubernetes block's address "
            f"({main.host}); give the bind there, or put this block on a port of its own"
        )
    where: Where = MAIN if port == main.port else (port, bind)
    for key, token in keys:
        if (where, key.zone) in taken:
            at = f" on {bind}" if bind is not None else ""
            raise token.error(
                f"the zone {key.text} on port {port}{at} is another server block's already "
                f"(line {taken[where, key.zone].line}), as CoreDNS refuses"
            )
        taken[where, key.zone] = token
    return BlockConfig(
        tuple(key.zone for key, _ in keys),
        key_tokens[0].place,
        options["forward"] if "forward" in seen else ForwardOptions(upstreams=()),
        options["cache"] if "cache" in seen else cache_off(options["cache"]),
        hosts=options["hosts"],
        template=options["template"],
        rewrite=options["rewrite"],
        port=None if where == MAIN else port,
        bind=bind,
        plugins=tuple(sorted((word for word in seen if word != "bind"), key=ORDER.index)),
    )


def _alongside(reading: Reading, line: Line, body: list[Line]) -> None:
    """`prometheus` and `log` in a block beside the kubernetes one: toposdns serves one
    /metrics and logs in one form, so they must say what the kubernetes block says."""
    word = line[0]
    if word.text == "prometheus":
        block = Reading((PROMETHEUS,))
        _directive(block, (PROMETHEUS,), word, [token.text for token in line[1:]], body)
        given = block.finished()["prometheus"].address
        served = reading.options["prometheus"].address
        if given != served:
            raise word.error(
                "a prometheus address other than the kubernetes block's: toposdns serves one "
                "/metrics for every port; give the same address in both"
            )
    elif len(line) > 1 or body or not reading.options["log"].enabled:
        raise word.error(
            "log in a server block without kubernetes: toposdns logs as the kubernetes block's "
            "plain `log` says, every query of its port and of the ports whose blocks have "
            "`log`; put `log` there"
        )


def _read(path: Path, at: Token | None) -> str:
    """A Corefile's text, bounded."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        where = f"{at.place}: import " if at is not None else ""
        raise ConfigError(f"{where}{path}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_FILE_BYTES} bytes: not a Corefile")
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def lex(text: str, file: str) -> list[Token]:
    """The words of a Corefile, with their lines; environment variables replaced."""
    tokens: list[Token] = []
    line, i, n = 1, 0, len(text)
    while i < n:
        char = text[i]
        if char == "\n":
            line += 1
            i += 1
        elif char.isspace():
            i += 1
        elif char == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif char == '"':
            start_line, i, word = line, i + 1, []
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n and text[i + 1] == '"':
                    i += 1
                line += text[i] == "\n"
                word.append(text[i])
                i += 1
            if i >= n:
                raise ConfigError(f"{file}:{start_line}: a quote that is never closed")
            i += 1
            tokens.append(Token(_environment("".join(word)), file, start_line, quoted=True))
        else:
            start = i
            while i < n and not text[i].isspace():
                i += 1
            tokens.append(Token(_environment(text[start:i]), file, line))
        if len(tokens) > MAX_TOKENS:
            raise ConfigError(f"{file}:{line}: more than {MAX_TOKENS} words: not a Corefile")
    return tokens


def _environment(word: str) -> str:
    """`{$NAME}` replaced by the environment variable NAME (empty when it is not set)."""
    return _ENV.sub(lambda match: os.environ.get(match.group(1), ""), word)


def expand(
    tokens: list[Token], base: Path, snippets: dict[str, list[Token]], depth: int
) -> list[Token]:
    """The tokens with snippets taken out and `import` lines replaced by what they import."""
    out: list[Token] = []
    i = depth_open = 0
    while i < len(tokens):
        token = tokens[i]
        first_of_line = i == 0 or (tokens[i - 1].file, tokens[i - 1].line) != (
            token.file,
            token.line,
        )
        if first_of_line and not depth_open and _is_snippet(token):
            end = _closing(tokens, i + 1)
            snippets[token.text[1:-1]] = tokens[i + 2 : end]
            i = end + 1
            continue
        if first_of_line and token.is_("import"):
            args = list(_rest_of_line(tokens, i))
            if len(args) != 1:
                raise token.error("expected one snippet name or file pattern")
            if depth >= MAX_IMPORT_DEPTH:
                raise token.error(f"imports nested more than {MAX_IMPORT_DEPTH} deep (a loop?)")
            out.extend(_imported(args[0], base, snippets, depth))
            i += 2
            continue
        depth_open += token.is_("{") - token.is_("}")
        out.append(token)
        i += 1
    return out


def _is_snippet(token: Token) -> bool:
    return not token.quoted and len(token.text) > 2 and token.text[0] + token.text[-1] == "()"


def _closing(tokens: list[Token], at: int) -> int:
    """The index of the `}` closing the block that the `{` at `at` opens."""
    if at >= len(tokens) or not tokens[at].is_("{"):
        raise tokens[at - 1].error("expected { after a snippet's name")
    depth = 0
    for index in range(at, len(tokens)):
        depth += tokens[index].is_("{") - tokens[index].is_("}")
        if depth == 0:
            return index
    raise tokens[at].error("this block is never closed with }")


def _rest_of_line(tokens: list[Token], at: int) -> Iterator[Token]:
    for token in tokens[at + 1 :]:
        if (token.file, token.line) != (tokens[at].file, tokens[at].line):
            return
        yield token


def _imported(arg: Token, base: Path, snippets: dict[str, list[Token]], depth: int) -> list[Token]:
    if arg.text in snippets:
        return expand(snippets[arg.text], base, snippets, depth + 1)
    pattern = arg.text if os.path.isabs(arg.text) else str(base / arg.text)
    files = sorted(glob.glob(pattern))
    if not files and not glob.has_magic(pattern):
        raise arg.error("no snippet of that name, and no such file")
    tokens: list[Token] = []
    for name in files:
        text = _read(Path(name), arg)
        tokens.extend(expand(lex(text, name), Path(name).parent, snippets, depth + 1))
    return tokens


Line = list[Token]
Block = tuple[list[Token], list[tuple[Line, list[Line]]]]


def server_blocks(tokens: list[Token]) -> list[Block]:
    """The server blocks: their keys, and their directives, each a line and its block's lines."""
    lines = _lines(tokens)
    blocks: list[Block] = []
    at = 0
    while at < len(lines):
        keys = lines[at]
        if keys[-1].is_("{"):
            keys = keys[:-1]
            body, at = _until_closed(lines, at + 1, keys[0] if keys else lines[at][0])
        elif not blocks and at + 1 < len(lines):
            body, at = lines[at + 1 :], len(lines)  # one block without braces
        else:
            body, at = [], at + 1
        if not keys:
            raise lines[at - 1][0].error("a block without server block keys, e.g. .:53 {")
        blocks.append((keys, _directives(body)))
    return blocks


def _lines(tokens: list[Token]) -> list[Line]:
    """Tokens grouped by the line they are on."""
    lines: list[Line] = []
    for token in tokens:
        if lines and (lines[-1][-1].file, lines[-1][-1].line) == (token.file, token.line):
            lines[-1].append(token)
        else:
            lines.append([token])
    for line in lines:
        for index, token in enumerate(line):
            if token.is_("{") and index != len(line) - 1:
                raise token.error("a { must end its line")
            if token.is_("}") and len(line) != 1:
                raise token.error("a } must be alone on its line")
    return lines


def _until_closed(lines: list[Line], at: int, opener: Token) -> tuple[list[Line], int]:
    """The lines of a block up to its closing `}` (nested blocks included), and the index
    of the line after it."""
    depth = 1
    for index in range(at, len(lines)):
        depth += lines[index][-1].is_("{") - lines[index][0].is_("}")
        if depth == 0:
            return lines[at:index], index + 1
    raise opener.error("this block is never closed with }")


def _directives(lines: list[Line]) -> list[tuple[Line, list[Line]]]:
    """A server block's lines as directives, each with the lines of its own block."""
    found: list[tuple[Line, list[Line]]] = []
    at = 0
    while at < len(lines):
        line = lines[at]
        if line[0].is_("}"):
            raise line[0].error("a } that closes nothing")
        if line[-1].is_("{"):
            body, at = _until_closed(lines, at + 1, line[0])
            for inner in body:
                if inner[-1].is_("{"):
                    raise inner[-1].error(f"{line[0].text}: its options take no blocks")
            found.append((line[:-1], body))
        else:
            found.append((line, []))
            at += 1
    return found


@dataclass(frozen=True, slots=True)
class Key:
    """A server block key: its zone and port."""

    zone: tuple[str, ...]
    text: str
    port: int


def parse_key(token: Token) -> list[Key]:
    """`[dns://]ZONE[:PORT]`, possibly several joined by commas."""
    keys = []
    for part in filter(None, token.text.split(",")):
        text = part
        scheme, sep, rest = part.partition("://")
        if sep:
            if scheme != "dns":
                raise token.error(f"{scheme}:// servers are not supported; only dns://")
            text = rest
        zone, _, port_text = text.partition(":")
        if port_text and not port_text.isdigit() or port_text and not 0 <= int(port_text) < 65536:
            raise token.error("the port must be a number from 0 to 65535")
        name = domain(zone or ".", Origin(token.text, place=token.place))
        keys.append(Key(name, zone or ".", int(port_text or 53)))
    return keys


def apply_block(
    reading: Reading, key_tokens: list[Token], directives: list[tuple[Line, list[Line]]]
) -> None:
    """A server block's keys and directives, read into the configuration."""
    keys = [key for token in key_tokens for key in parse_key(token)]
    if len({key.port for key in keys}) > 1:
        raise key_tokens[0].error("every key of the server block must have the same port")
    start = key_tokens[0]
    # CoreDNS's health plugin has no lameduck unless its block sets one; CoreDNS is one
    # process (in kubeadm's 170Mi): more workers only with `toposdns { workers N }`.
    reading.options["health"] = replace(reading.options["health"], lameduck=0.0)
    reading.options["toposdns"] = replace(reading.options["toposdns"], workers=1)
    seen: dict[str, Token] = {}
    for line, body in directives:
        word = line[0]
        if word.quoted or word.text not in DIRECTIVES and word.text not in ACCEPTED:
            raise word.error(f"unknown plugin; supported: {', '.join(SUPPORTED)}")
        if word.text in seen and word.text not in REPEATABLE:
            raise word.error(
                f"given twice in the server block (first at line {seen[word.text].line})"
            )
        seen[word.text] = word
        if word.text in ACCEPTED:
            _accepted(line, body)
            continue
        args = [token.text for token in line[1:]]
        if word.text in ("kubernetes", "acl") and not args:
            args = [key.text for key in keys]  # the server block's zones, as CoreDNS
        _directive(reading, DIRECTIVES[word.text], word, args, body)
    if "kubernetes" not in seen:
        raise start.error("no kubernetes plugin in the server block: toposdns is one")
    _absent(reading, seen)
    reading.options["bind"] = replace(reading.options["bind"], port=keys[0].port)
    reading.block_zones = tuple(key.zone for key in keys)


def _accepted(line: Line, body: list[Line]) -> None:
    if len(line) > 1 or body:
        raise line[0].error(f"takes no arguments or options here ({ACCEPTED[line[0].text]})")


def _directive(
    reading: Reading,
    plugins: Sequence[Plugin[Any]],
    word: Token,
    args: list[str],
    body: list[Line],
) -> None:
    """One directive: its arguments, then each option of its block, through its settings."""
    place = word.place
    for plugin in plugins:
        reading.origins.setdefault(plugin.name, Origin(word.text, place=place))
    own = next(((p, s) for p in plugins if (s := p.setting("")) is not None), None)
    if own is not None:
        reading.apply(*own, args, Origin(word.text, " ".join(args), place))
    elif args:
        raise word.error("takes no arguments")
    for line in body:
        option = line[0]
        words = [token.text for token in line[1:]]
        found = next(((p, s) for p in plugins if (s := p.setting(option.text)) is not None), None)
        said = option.text
        if found is None and not option.quoted:
            # A line of data rather than an option (a `hosts` entry): the plugin's `*` setting
            # takes it whole, and a message names the directive before it.
            found = next(((p, s) for p in plugins if (s := p.setting("*")) is not None), None)
            words, said = [option.text, *words], word.text
        if option.quoted or found is None:
            supported = sorted(w for plugin in plugins for w in plugin.words())
            raise option.error(
                f"not an option of {word.text}; supported: {', '.join(supported) or 'none'}"
            )
        reading.apply(*found, words, Origin(said, " ".join(words), option.place))


def _absent(reading: Reading, seen: dict[str, Token]) -> None:
    """What a Corefile leaves out is off, as in CoreDNS: no forwarding, no cache, no lameduck."""
    options = reading.options
    if "forward" not in seen:
        options["forward"] = replace(options["forward"], upstreams=())
    if "cache" not in seen:
        options["cache"] = cache_off(options["cache"])
