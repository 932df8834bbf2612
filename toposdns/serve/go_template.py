"""A bounded subset of Go's text/template, for the records CoreDNS's `template` plugin renders.

No maintained Python package implements Go's templates (the two on PyPI bind Go's own through
cgo, unmaintained), so this is the part of the language CoreDNS's templates use, read as Go
reads it and refused at startup past that:

- text, and actions `{{ pipeline }}` with Go's trim markers (`{{- ` and ` -}}`) and comments
  (`{{/* ... */}}`);
- pipelines of commands joined by `|` (the value of each is the last argument of the next),
  parenthesised pipelines, and field chains on them (`(index .Match 1)`);
- operands: `.`, fields and their chains (`.Name`, `.Group.a`, `$.Zone`), `$`, strings
  (`"..."` and raw), integers, `true`, `false`, `nil`;
- the functions `index`, `len`, `print`, `printf`, `println`, `eq`, `ne`, `lt`, `le`, `gt`,
  `ge`, `and`, `or`, `not`, and CoreDNS's `parseInt` (Go's `strconv.ParseUint`);
- `{{if}}`, `{{else if}}`, `{{else}}`, `{{with}}`, `{{end}}`.

`range`, `define`, `template`, `block`, variables of one's own (`$x := ...`) and the builtins
`call`, `html`, `js`, `slice` and `urlquery` are refused where Go would accept them, with the
reason. What Go refuses at parse time (an unclosed action, an undefined function) is refused
too; what it finds only when it runs (a field the data does not have, an index out of range,
`parseInt` of a bad number) fails the rendering, as in Go, and CoreDNS answers SERVFAIL.

The work is bounded: a template has no loops, each value is at most a query's name long, and
the text rendered is cut off (an error) past `MAX_OUTPUT` characters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: The most characters one rendering may produce (a record's text; a name is at most ~1 KB).
MAX_OUTPUT = 16384
#: The widest `printf` field.
MAX_WIDTH = 1024


class TemplateError(ValueError):
    """A template that Go's parser refuses, or that uses what this subset does not have."""


class RenderError(Exception):
    """A rendering that fails as Go's execution fails (the message is Go's, in short)."""


class _Missing:
    """Go's invalid value: a map's missing key read as a field (printed `<no value>`)."""

    def __repr__(self) -> str:
        return "<no value>"


MISSING = _Missing()

# ----- the parse tree (each node's `source` is Go's parse.Node String(): CoreDNS's metric label)


@dataclass(frozen=True, slots=True)
class Text:
    text: str

    def source(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class Comment:
    text: str

    def source(self) -> str:
        return "{{" + self.text + "}}"


@dataclass(frozen=True, slots=True)
class Dot:
    def source(self) -> str:
        return "."


@dataclass(frozen=True, slots=True)
class Field:
    """`.A.B`: fields of dot."""

    names: tuple[str, ...]

    def source(self) -> str:
        return "." + ".".join(self.names)


@dataclass(frozen=True, slots=True)
class Variable:
    """`$` (the data) and `$.A.B`."""

    names: tuple[str, ...]

    def source(self) -> str:
        return ".".join(("$", *self.names))


@dataclass(frozen=True, slots=True)
class Literal:
    value: object
    text: str

    def source(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class Function:
    name: str

    def source(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Chain:
    """`(pipeline).A.B`."""

    pipe: Pipe
    names: tuple[str, ...]

    def source(self) -> str:
        return "(" + self.pipe.source() + ")" + "".join("." + name for name in self.names)


Operand = Dot | Field | Variable | Literal | Function | Chain


@dataclass(frozen=True, slots=True)
class Command:
    args: tuple[Operand | Pipe, ...]

    def source(self) -> str:
        return " ".join(
            "(" + arg.source() + ")" if isinstance(arg, Pipe) else arg.source() for arg in self.args
        )


@dataclass(frozen=True, slots=True)
class Pipe:
    commands: tuple[Command, ...]

    def source(self) -> str:
        return " | ".join(command.source() for command in self.commands)


@dataclass(frozen=True, slots=True)
class Action:
    pipe: Pipe

    def source(self) -> str:
        return "{{" + self.pipe.source() + "}}"


@dataclass(frozen=True, slots=True)
class Branch:
    """`{{if}}` or `{{with}}`, with its else part (None: none)."""

    keyword: str
    pipe: Pipe
    then: tuple[Node, ...]
    otherwise: tuple[Node, ...] | None

    def source(self) -> str:
        text = "{{" + self.keyword + " " + self.pipe.source() + "}}" + _source(self.then)
        if self.otherwise is not None:
            text += "{{else}}" + _source(self.otherwise)
        return text + "{{end}}"


Node = Text | Comment | Action | Branch


def _source(nodes: Sequence[Node]) -> str:
    return "".join(node.source() for node in nodes)


# ----- the lexer: text and actions, then the tokens of an action

#: Go's builtins with the subset's implementation, plus CoreDNS's parseInt.
FUNCTIONS = (
    "and", "or", "not", "index", "len", "print", "printf", "println",
    "eq", "ne", "lt", "le", "gt", "ge", "parseInt",
)  # fmt: skip
#: Go's builtins this subset leaves out: Go accepts them, so they are refused by name.
LEFT_OUT = ("call", "html", "js", "slice", "urlquery")
_KEYWORDS = ("if", "else", "end", "with", "range", "define", "template", "block", "break")
_SPACE = " \t\r\n"
_SPACES = tuple(_SPACE)


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # field, variable, ident, string, number, char, dot, ( ) | := = , space
    text: str


def _actions(text: str) -> list[tuple[str, str]]:
    """The text split into ("text", TEXT), ("action", INSIDE) and ("comment", COMMENT) parts,
    with Go's trim markers applied to the text around them."""
    parts: list[tuple[str, str]] = []
    at = 0
    trim_next = False
    while True:
        start = text.find("{{", at)
        chunk = text[at:] if start < 0 else text[at:start]
        if trim_next:
            chunk = chunk.lstrip(_SPACE)
        if start < 0:
            if chunk:
                parts.append(("text", chunk))
            return parts
        inside = start + 2
        if text.startswith("-", inside) and text[inside + 1 : inside + 2] in _SPACES:
            chunk = chunk.rstrip(_SPACE)
            inside += 2
        if chunk:
            parts.append(("text", chunk))
        end, trim_next = _action_end(text, inside)
        inner = text[inside:end]
        if inner.startswith("/*"):
            if not inner.endswith("*/"):
                raise TemplateError("comment ends before closing delimiter")
            parts.append(("comment", inner))
        else:
            parts.append(("action", inner))
        at = end + (4 if trim_next else 2)  # past ` -}}` or `}}`


def _action_end(text: str, inside: int) -> tuple[int, bool]:
    """Where the action starting at `inside` ends (its `}}`, or the ` -}}` trim marker), and
    whether it trims: quotes and raw strings may hold braces."""
    i = inside
    n = len(text)
    if text.startswith("/*", i):
        close = text.find("*/", i)
        if close < 0:
            raise TemplateError("unclosed comment")
        i = close + 2
    while i < n:
        char = text[i]
        if char in "\"'":
            i = _string_end(text, i, char) + 1
            continue
        if char == "`":
            close = text.find("`", i + 1)
            if close < 0:
                raise TemplateError("unterminated raw quoted string")
            i = close + 1
            continue
        if text.startswith("}}", i):
            return i, False
        if char in _SPACES and text.startswith("-}}", i + 1):
            return i, True
        i += 1
    raise TemplateError("unclosed action")


def _string_end(text: str, start: int, quote: str) -> int:
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == quote:
            return i
        if text[i] == "\n":
            break
        i += 1
    raise TemplateError("unterminated quoted string" if quote == '"' else "unterminated character")


def _tokens(inside: str) -> list[_Token]:
    """The tokens of one action."""
    tokens: list[_Token] = []
    i, n = 0, len(inside)
    while i < n:
        char = inside[i]
        if char in _SPACE:
            while i < n and inside[i] in _SPACE:
                i += 1
            tokens.append(_Token("space", " "))
        elif char in "()|,":
            tokens.append(_Token(char, char))
            i += 1
        elif inside.startswith(":=", i):
            tokens.append(_Token(":=", ":="))
            i += 2
        elif char == "=":
            tokens.append(_Token("=", "="))
            i += 1
        elif char == '"':
            end = _string_end(inside, i, '"')
            tokens.append(_Token("string", inside[i : end + 1]))
            i = end + 1
        elif char == "`":
            end = inside.find("`", i + 1)
            tokens.append(_Token("string", inside[i : end + 1]))
            i = end + 1
        elif char == "'":
            end = _string_end(inside, i, "'")
            tokens.append(_Token("char", inside[i : end + 1]))
            i = end + 1
        elif char == "." and i + 1 < n and (inside[i + 1].isalpha() or inside[i + 1] == "_"):
            end = _word_end(inside, i + 1)
            tokens.append(_Token("field", inside[i + 1 : end]))
            i = end
        elif char == "." and i + 1 < n and inside[i + 1].isdigit():
            end = _word_end(inside, i + 1)
            tokens.append(_Token("number", inside[i:end]))
            i = end
        elif char == ".":
            tokens.append(_Token("dot", "."))
            i += 1
        elif char == "$":
            end = _word_end(inside, i + 1)
            tokens.append(_Token("variable", inside[i:end]))
            i = end
        elif char.isdigit() or char in "+-" and i + 1 < n and inside[i + 1].isdigit():
            end = i + 1
            while end < n and (
                inside[end].isalnum()
                or inside[end] in "_."
                or inside[end] in "+-"
                and inside[end - 1] in "eEpP"
            ):
                end += 1
            tokens.append(_Token("number", inside[i:end]))
            i = end
        elif char.isalpha() or char == "_":
            end = _word_end(inside, i)
            tokens.append(_Token("ident", inside[i:end]))
            i = end
        else:
            raise TemplateError(f"unrecognized character in action: {char!r}")
    return tokens


def _word_end(text: str, i: int) -> int:
    while i < len(text) and (text[i].isalnum() or text[i] == "_"):
        i += 1
    return i


# ----- the parser


def parse(text: str) -> tuple[Node, ...]:
    """A template's parse tree; TemplateError says what Go (or this subset) refuses."""
    parser = _Parser(_actions(text))
    nodes, end = parser.nodes(top=True)
    if end is not None:
        raise TemplateError(f"unexpected {{{{{end}}}}}")
    return tuple(nodes)


class _Parser:
    def __init__(self, parts: list[tuple[str, str]]) -> None:
        self.parts = parts
        self.at = 0
        #: The `if` or `with` of an `{{else if ...}}` just read, and its tokens.
        self.pending: tuple[str, list[_Token]] = ("", [])

    def nodes(self, top: bool = False) -> tuple[list[Node], str | None]:
        """Nodes up to an `{{else...}}` or `{{end}}` (returned: "else", "else if", "end"), or
        the end of the text (None)."""
        nodes: list[Node] = []
        while self.at < len(self.parts):
            kind, body = self.parts[self.at]
            self.at += 1
            if kind == "text":
                nodes.append(Text(body))
                continue
            if kind == "comment":
                nodes.append(Comment(body))
                continue
            tokens = _tokens(body)
            words = [token for token in tokens if token.kind != "space"]
            if not words:
                raise TemplateError("missing value for command")
            first = words[0]
            if first.kind == "ident" and first.text in _KEYWORDS:
                keyword = first.text
                if keyword == "end":
                    if len(words) > 1:
                        raise TemplateError("unexpected words in end")
                    if top:
                        raise TemplateError("unexpected {{end}}")
                    return nodes, "end"
                if keyword == "else":
                    if top:
                        raise TemplateError("unexpected {{else}}")
                    if len(words) > 1 and words[1].text in ("if", "with"):
                        self.pending = (words[1].text, _after(tokens, 2))
                        return nodes, "else " + words[1].text
                    if len(words) > 1:
                        raise TemplateError("unexpected words in else")
                    return nodes, "else"
                if keyword in ("if", "with"):
                    nodes.append(self.branch(keyword, _after(tokens, 1)))
                    continue
                raise TemplateError(f"{{{{{keyword}}}}} is not supported here")
            nodes.append(Action(_pipe(tokens)))
        return nodes, None

    def branch(self, keyword: str, tokens: list[_Token]) -> Branch:
        pipe = _pipe(tokens, keyword)
        then, end = self.nodes()
        if end is None:
            raise TemplateError(f"unexpected EOF in {keyword}")
        if end == "end":
            return Branch(keyword, pipe, tuple(then), None)
        if end == "else":
            otherwise, end = self.nodes()
            if end != "end":
                raise TemplateError(f"expected end; found {{{{{end or 'EOF'}}}}}")
            return Branch(keyword, pipe, tuple(then), tuple(otherwise))
        # `{{else if ...}}`: an if inside the else part, sharing its {{end}}
        inner_keyword, inner_tokens = self.pending
        inner = self.branch(inner_keyword, inner_tokens)
        return Branch(keyword, pipe, tuple(then), (inner,))


def _after(tokens: list[_Token], words: int) -> list[_Token]:
    """The tokens after the first `words` words."""
    seen = 0
    for index, token in enumerate(tokens):
        if token.kind != "space":
            seen += 1
            if seen == words:
                return tokens[index + 1 :]
    return []


def _pipe(tokens: list[_Token], context: str = "command") -> Pipe:
    """A pipeline from its tokens."""
    reader = _Reader(tokens)
    pipe = reader.pipe(context)
    if reader.peek() is not None:
        token = reader.peek()
        assert token is not None
        raise TemplateError(f"unexpected {token.text!r} in {context}")
    return pipe


class _Reader:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.at = 0

    def peek(self, spaces: bool = False) -> _Token | None:
        at = self.at
        while not spaces and at < len(self.tokens) and self.tokens[at].kind == "space":
            at += 1
        return self.tokens[at] if at < len(self.tokens) else None

    def next(self) -> _Token:
        token = self.peek()
        assert token is not None
        self.at = self.tokens.index(token, self.at) + 1
        return token

    def pipe(self, context: str, closing: str = "") -> Pipe:
        commands: list[Command] = []
        while True:
            token = self.peek()
            if token is not None and token.kind in (":=", "="):
                raise TemplateError("variables of one's own ($x := ...) are not supported here")
            args: list[Operand | Pipe] = []
            while (token := self.peek()) is not None and token.kind not in ("|", ")"):
                args.append(self.operand())
            if not args:
                raise TemplateError(f"missing value for {context}")
            if commands and isinstance(args[0], (Literal, Dot)):
                stage = len(commands) + 1
                raise TemplateError(f"non executable command in pipeline stage {stage}")
            commands.append(Command(tuple(args)))
            token = self.peek()
            if token is None or token.kind == ")":
                if token is not None and not closing:
                    raise TemplateError("unexpected right paren")
                return Pipe(tuple(commands))
            self.next()  # |

    def operand(self) -> Operand | Pipe:
        token = self.next()
        kind, text = token.kind, token.text
        operand: Operand | Pipe
        if kind == "field":
            names = [text]
            while (following := self.peek(spaces=True)) is not None and following.kind == "field":
                names.append(self.next().text)
            return Field(tuple(names))
        if kind == "variable":
            if text != "$":
                raise TemplateError(f"undefined variable {text!r} (only $ is defined here)")
            names = []
            while (following := self.peek(spaces=True)) is not None and following.kind == "field":
                names.append(self.next().text)
            return Variable(tuple(names))
        if kind == "dot":
            return Dot()
        if kind == "(":
            inner = self.pipe("parenthesized pipeline", closing=")")
            if (closing := self.peek()) is None or closing.kind != ")":
                raise TemplateError("unclosed left paren")
            self.next()
            names = []
            while (following := self.peek(spaces=True)) is not None and following.kind == "field":
                names.append(self.next().text)
            operand = Chain(inner, tuple(names)) if names else inner
            return operand
        if kind == "string":
            return Literal(_unquote(text), text)
        if kind == "number":
            return Literal(_number(text), text)
        if kind == "char":
            raise TemplateError(f"character constants ({text}) are not supported here")
        if kind == "ident":
            if text in ("true", "false"):
                return Literal(text == "true", text)
            if text == "nil":
                return Literal(None, text)
            if text in LEFT_OUT:
                raise TemplateError(f"function {text!r} is not supported here")
            if text in _KEYWORDS:
                raise TemplateError(f"unexpected {text} in command")
            if text not in FUNCTIONS:
                raise TemplateError(f'function "{text}" not defined')
            return Function(text)
        raise TemplateError(f"unexpected {text!r} in operand")


def _unquote(text: str) -> str:
    """A Go string literal's value."""
    if text.startswith("`"):
        return text[1:-1]
    body = text[1:-1]
    out: list[str] = []
    i = 0
    simple = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
    while i < len(body):
        char = body[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        escape = body[i + 1 : i + 2]
        if escape in simple:
            out.append(simple[escape])
            i += 2
        elif escape in ('"', "\\"):
            out.append(escape)
            i += 2
        elif escape in ("x", "u", "U"):
            size = {"x": 2, "u": 4, "U": 8}[escape]
            digits = body[i + 2 : i + 2 + size]
            if len(digits) != size or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise TemplateError(f"invalid syntax in string {text}")
            out.append(chr(int(digits, 16)))
            i += 2 + size
        elif escape.isdigit():
            digits = body[i + 1 : i + 4]
            if len(digits) != 3 or any(c not in "01234567" for c in digits):
                raise TemplateError(f"invalid syntax in string {text}")
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise TemplateError(f"invalid syntax in string {text}")
    return "".join(out)


def _number(text: str) -> int:
    """A Go integer constant (decimal, 0x, 0o, 0b, leading 0 octal, underscores)."""
    digits = text.replace("_", "")
    sign = -1 if digits.startswith("-") else 1
    digits = digits.lstrip("+-")
    try:
        lowered = digits.lower()
        if lowered.startswith(("0x", "0o", "0b")):
            return sign * int(digits, 0)
        if len(digits) > 1 and digits.startswith("0"):
            return sign * int(digits, 8)
        return sign * int(digits, 10)
    except ValueError:
        raise TemplateError(
            f"number {text} is not supported here (only integers)"
            if any(c in text for c in ".eEpPi")
            else f"bad number syntax: {text!r}"
        ) from None


# ----- execution


class Fields:
    """A value with fields and methods, as a Go struct (or a pointer to one) is to a
    template: its `fields` by name, its `methods` called with their arguments."""

    type_name = "struct"

    def field(self, name: str) -> object:
        raise RenderError(f"can't evaluate field {name} in type {self.type_name}")

    def method(self, name: str) -> Callable[..., object] | None:
        return None

    def text(self) -> str:
        """How Go's fmt prints it."""
        return "{" + self.type_name + "}"


def render(nodes: Sequence[Node], data: object) -> str:
    """The template's text for `data`; RenderError when Go's execution would fail."""
    out: list[str] = []
    _Run(data, out).walk(nodes, data)
    return "".join(out)


class _Run:
    def __init__(self, data: object, out: list[str]) -> None:
        self.root = data
        self.out = out
        self.size = 0

    def emit(self, text: str) -> None:
        self.size += len(text)
        if self.size > MAX_OUTPUT:
            raise RenderError(f"renders more than {MAX_OUTPUT} characters")
        self.out.append(text)

    def walk(self, nodes: Sequence[Node], dot: object) -> None:
        for node in nodes:
            if isinstance(node, Text):
                self.emit(node.text)
            elif isinstance(node, Action):
                value = self.pipe(node.pipe, dot)
                self.emit("<no value>" if value is MISSING else printed(value))
            elif isinstance(node, Branch):
                value = self.pipe(node.pipe, dot)
                if truth(value):
                    self.walk(node.then, value if node.keyword == "with" else dot)
                elif node.otherwise is not None:
                    self.walk(node.otherwise, dot)

    def pipe(self, pipe: Pipe, dot: object) -> object:
        value: object = _NOTHING
        for command in pipe.commands:
            value = self.command(command, dot, value)
        return value

    def command(self, command: Command, dot: object, piped: object) -> object:
        first, args = command.args[0], command.args[1:]
        if isinstance(first, Function):
            return self.call(first.name, args, dot, piped)
        if isinstance(first, (Field, Variable, Chain)):
            receiver = self.root if isinstance(first, Variable) else dot
            if isinstance(first, Chain):
                receiver = self.pipe(first.pipe, dot)
            names = first.names
            if not names:
                return self.no_arguments(receiver, args, piped, first)
            for name in names[:-1]:
                receiver = field_of(receiver, name, ())
            rest = [self.arg(arg, dot) for arg in args]
            if piped is not _NOTHING:
                rest.append(piped)
            return field_of(receiver, names[-1], rest)
        if isinstance(first, Literal) and first.value is None:
            raise RenderError("nil is not a command")
        value = self.arg(first, dot)
        return self.no_arguments(value, args, piped, first)

    def no_arguments(
        self, value: object, args: Sequence[Operand | Pipe], piped: object, first: object
    ) -> object:
        if args or piped is not _NOTHING:
            shown = first.source() if isinstance(first, (Dot, Literal, Pipe, Variable)) else ""
            raise RenderError(f"can't give argument to non-function {shown}")
        return value

    def arg(self, arg: Operand | Pipe, dot: object) -> object:
        if isinstance(arg, Pipe):
            return self.pipe(arg, dot)
        if isinstance(arg, Dot):
            return dot
        if isinstance(arg, Literal):
            return arg.value
        if isinstance(arg, Function):
            return self.call(arg.name, (), dot, _NOTHING)
        return self.command(Command((arg,)), dot, _NOTHING)

    def call(self, name: str, args: Sequence[Operand | Pipe], dot: object, piped: object) -> object:
        if name in ("and", "or"):  # only as many arguments as decide it are evaluated
            count = len(args) + (piped is not _NOTHING)
            if count < 1:
                raise RenderError(f"wrong number of args for {name}: want at least 1 got 0")
            value: object = None
            for arg in args:
                value = self.arg(arg, dot)
                if truth(value) != (name == "and"):
                    return value
            return piped if piped is not _NOTHING else value
        values = [self.arg(arg, dot) for arg in args]
        if piped is not _NOTHING:
            values.append(piped)
        try:
            return BUILTINS[name](*[None if v is MISSING else v for v in values])
        except TypeError:
            raise RenderError(f"wrong number of args for {name}: got {len(values)}") from None


class _Nothing:
    """No value piped in."""


_NOTHING = _Nothing()


def field_of(receiver: object, name: str, args: Sequence[object]) -> object:
    """`receiver.name`, called with `args` when it is a method."""
    if isinstance(receiver, dict):
        if args:
            raise RenderError(f"{name} is not a method but has arguments")
        return receiver.get(name, MISSING)
    if isinstance(receiver, Fields):
        method = receiver.method(name)
        if method is not None:
            try:
                return method(*args)
            except TypeError:
                raise RenderError(f"wrong number of args for {name}: got {len(args)}") from None
        if args:
            raise RenderError(f"{name} has arguments but cannot be invoked as function")
        return receiver.field(name)
    if receiver is None or receiver is MISSING:
        raise RenderError(f"nil pointer evaluating .{name}")
    raise RenderError(f"can't evaluate field {name} in type {go_type(receiver)}")


def go_type(value: object) -> str:
    """The Go type a value stands for, for messages."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "[]string"
    if isinstance(value, dict):
        return "map[string]string"
    if isinstance(value, Fields):
        return value.type_name
    return "<nil>"


def truth(value: object) -> bool:
    """Go's truth of a value: false, 0, "", nil, and empty lists and maps are false."""
    if value is None or value is MISSING:
        return False
    if isinstance(value, (bool, int, str, list, dict)):
        return bool(value)
    return True


def printed(value: object) -> str:
    """A value as Go's fmt prints it with %v."""
    if value is None:
        return "<nil>"
    if value is MISSING:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, str)):
        return str(value)
    if isinstance(value, list):
        return "[" + " ".join(printed(item) for item in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{printed(value[k])}" for k in sorted(value)) + "]"
    if isinstance(value, Fields):
        return value.text()
    return str(value)


# ----- the functions


def _index(item: object, *keys: object) -> object:
    for key in keys:
        if isinstance(item, (list, str)):
            if not isinstance(key, int) or isinstance(key, bool):
                raise RenderError(
                    f"error calling index: cannot index slice/array with type {go_type(key)}"
                )
            if not 0 <= key < len(item):
                raise RenderError(f"error calling index: index out of range: {key}")
            item = item[key] if isinstance(item, list) else item.encode()[key]
        elif isinstance(item, dict):
            if not isinstance(key, str):
                raise RenderError(
                    f"error calling index: value has type {go_type(key)}; should be string"
                )
            item = item.get(key, "")
        elif item is None:
            raise RenderError("error calling index: index of untyped nil")
        else:
            raise RenderError(f"error calling index: can't index item of type {go_type(item)}")
    return item


def _len(item: object) -> int:
    if isinstance(item, str):
        return len(item.encode())
    if isinstance(item, (list, dict)):
        return len(item)
    raise RenderError(f"error calling len: len of type {go_type(item)}")


def _not(value: object) -> bool:
    return not truth(value)


def parse_uint(text: object, base: object, bits: object) -> int:
    """Go's strconv.ParseUint, which CoreDNS's templates call `parseInt`."""
    if not isinstance(text, str):
        raise RenderError(f"wrong type for value; expected string; got {go_type(text)}")
    for value in (base, bits):
        if not isinstance(value, int) or isinstance(value, bool):
            raise RenderError(f"wrong type for value; expected int; got {go_type(value)}")
    assert isinstance(base, int) and isinstance(bits, int)
    quoted = '"' + text + '"'
    fail = f"error calling parseInt: strconv.ParseUint: parsing {quoted}"
    if not text:
        raise RenderError(f"{fail}: invalid syntax")
    digits = text
    if base == 0:
        base = 10
        lowered = text.lower()
        if lowered.startswith(("0x", "0o", "0b")) and len(text) > 2:
            base = {"x": 16, "o": 8, "b": 2}[lowered[1]]
            digits = text[2:]
        elif text.startswith("0"):
            base, digits = 8, text[1:] or "0"
        if "_" in digits:  # allowed between digits with a base prefix, as Go's underscoreOK
            if digits.startswith("_") or digits.endswith("_") or "__" in digits:
                raise RenderError(f"{fail}: invalid syntax")
            digits = digits.replace("_", "")
    elif not 2 <= base <= 36:
        raise RenderError(f"{fail}: invalid base {base}")
    if bits == 0:
        bits = 64
    if not 0 < bits <= 64:
        raise RenderError(f"{fail}: invalid bit size {bits}")
    valid = "0123456789abcdefghijklmnopqrstuvwxyz"[:base]
    if not digits or any(c not in valid for c in digits.lower()):
        raise RenderError(f"{fail}: invalid syntax")
    value = int(digits, base)
    if value >= 1 << bits:
        raise RenderError(f"{fail}: value out of range")
    return value


def _print(*values: object) -> str:
    out = []
    for index, value in enumerate(values):
        if index and not isinstance(value, str) and not isinstance(values[index - 1], str):
            out.append(" ")
        out.append(printed(value))
    return "".join(out)


def _println(*values: object) -> str:
    return " ".join(printed(value) for value in values) + "\n"


def _printf(form: object, *values: object) -> str:
    if not isinstance(form, str):
        raise RenderError(f"wrong type for value; expected string; got {go_type(form)}")
    return sprintf(form, values)


def _basic(value: object) -> object:
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    raise RenderError(f"error calling eq: invalid type for comparison: {go_type(value)}")


def _compare(name: str, left: object, right: object) -> int:
    left, right = _basic(left), _basic(right)
    if isinstance(left, bool) or isinstance(right, bool):
        if type(left) is not type(right):
            raise RenderError(f"error calling {name}: incompatible types for comparison")
        if name not in ("eq", "ne"):
            raise RenderError(f"error calling {name}: invalid type for comparison")
        return 0 if left == right else 1
    if isinstance(left, int) and isinstance(right, int):
        return (left > right) - (left < right)
    if isinstance(left, str) and isinstance(right, str):
        return (left > right) - (left < right)
    if left is None and right is None and name in ("eq", "ne"):
        return 0
    raise RenderError(f"error calling {name}: incompatible types for comparison")


def _eq(first: object, *others: object) -> bool:
    if not others:
        raise RenderError("error calling eq: missing argument for comparison")
    return any(_compare("eq", first, other) == 0 for other in others)


def _ordered(name: str, test: Callable[[int], bool]) -> Callable[[object, object], bool]:
    def compare(left: object, right: object) -> bool:
        return test(_compare(name, left, right))

    return compare


BUILTINS: dict[str, Callable[..., Any]] = {
    "index": _index,
    "len": _len,
    "not": _not,
    "parseInt": parse_uint,
    "print": _print,
    "println": _println,
    "printf": _printf,
    "eq": _eq,
    "ne": _ordered("ne", lambda c: c != 0),
    "lt": _ordered("lt", lambda c: c < 0),
    "le": _ordered("le", lambda c: c <= 0),
    "gt": _ordered("gt", lambda c: c > 0),
    "ge": _ordered("ge", lambda c: c >= 0),
}


def sprintf(form: str, values: Sequence[object]) -> str:
    """Go's fmt.Sprintf for the verbs v s d q x X o b c t and %%, with flags, width and
    precision (each at most MAX_WIDTH)."""
    out: list[str] = []
    i = used = 0
    n = len(form)
    while i < n:
        char = form[i]
        if char != "%":
            out.append(char)
            i += 1
            continue
        i += 1
        flags = ""
        while i < n and form[i] in "+-# 0":
            flags += form[i]
            i += 1
        width, i = _count(form, i)
        precision = None
        if i < n and form[i] == ".":
            precision, i = _count(form, i + 1)
            precision = precision or 0
        if i >= n:
            out.append("%!(NOVERB)")
            break
        verb = form[i]
        i += 1
        if verb == "%":
            out.append("%")
            continue
        if used >= len(values):
            out.append(f"%!{verb}(MISSING)")
            continue
        value = values[used]
        used += 1
        out.append(_pad(_verb(verb, value, flags, precision), width, flags))
    if used < len(values):
        extra = ", ".join(f"{go_type(v)}={printed(v)}" for v in values[used:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


def _count(form: str, i: int) -> tuple[int | None, int]:
    start = i
    while i < len(form) and form[i].isdigit():
        i += 1
    if i == start:
        return None, i
    count = int(form[start:i])
    if count > MAX_WIDTH:
        raise RenderError(f"printf width or precision {count} is over {MAX_WIDTH}")
    return count, i


def _verb(verb: str, value: object, flags: str, precision: int | None) -> str:
    bad = f"%!{verb}({go_type(value)}={printed(value)})"
    if isinstance(value, bool):
        return ("true" if value else "false") if verb in "vt" else bad
    if isinstance(value, int):
        sign = "-" if value < 0 else "+" if "+" in flags else " " if " " in flags else ""
        number = abs(value)
        if verb in "vd":
            digits = str(number)
        elif verb in "xX":
            digits = format(number, "x" if verb == "x" else "X")
            digits = ("0x" if verb == "x" else "0X") + digits if "#" in flags else digits
        elif verb == "o":
            digits = ("0" if "#" in flags else "") + format(number, "o")
        elif verb == "b":
            digits = format(number, "b")
        elif verb == "c":
            return chr(value) if 0 <= value <= 0x10FFFF else "\ufffd"
        elif verb == "q":
            return "'" + chr(value) + "'" if 0 <= value <= 0x10FFFF else bad
        else:
            return bad
        if precision is not None:
            digits = digits.rjust(precision, "0")
        return sign + digits
    if isinstance(value, str):
        text = value if precision is None else value[:precision]
        if verb in "vs":
            return text
        if verb == "q":
            return go_quote(text)
        if verb in "xX":
            return text.encode().hex() if verb == "x" else text.encode().hex().upper()
        return bad
    if verb in "vs":
        return printed(value)
    return bad


def _pad(text: str, width: int | None, flags: str) -> str:
    if width is None or len(text) >= width:
        return text
    if "-" in flags:
        return text.ljust(width)
    if "0" in flags and (text[:1].isdigit() or text[:1] in "+- "):
        sign = text[0] if text[0] in "+- " else ""
        return sign + text[len(sign) :].rjust(width - len(sign), "0")
    return text.rjust(width)


def go_quote(text: str) -> str:
    """Go's strconv.Quote."""
    out = ['"']
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    escapes |= {"\v": "\\v", "\\": "\\\\", '"': '\\"'}
    for char in text:
        if char in escapes:
            out.append(escapes[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        elif not char.isprintable():
            out.append(f"\\u{ord(char):04x}" if ord(char) < 0x10000 else f"\\U{ord(char):08x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)
