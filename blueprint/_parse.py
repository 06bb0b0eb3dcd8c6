"""Read the DSL's own `repr` back without evaluating it.

A checkpoint stores its model, loss, optimizer and scheduler as the `repr` of their values
(DSL code such as ``BluePrint(seq(conv(16, 3, 1, 1), bn(), relu()))`` or
``SGD().lr(0.05).momentum(0.9)``). Loading such text with `eval` would run whatever a file
says, so loaders use this parser instead. It accepts exactly the grammar `repr` prints:

    value   := atom trailer*
    atom    := NAME | NUMBER | '-' NUMBER | STRING | '(' values ')' | '[' values ']'
    trailer := '(' values ')' | '.' NAME
    values  := [value (',' value)* [',']]

and gives meaning to nothing but

- calls of the DSL factories (one per `Kind`: the names `repr` prints), of `BluePrint`, and of
  the configuration classes of `blueprint.optim` (its `__all__`);
- chained builder methods of a configuration value (a public method of its class that
  returns a value of that class, such as ``.lr(0.1)``);
- ``BlockStyle.X`` members, and int / float / bool / None / str literals, tuples and lists.

Everything else (other names, attributes such as ``__class__``, keyword arguments,
operators, comprehensions, any other syntax) raises `ConfigError` quoting the text; a
factory that refuses its arguments is reported the same way. Nothing is compiled or
evaluated: the text is tokenised with one regular expression and read with an explicit
stack, so nesting depth is limited by memory, not by Python's recursion limit.
"""
from __future__ import annotations

import ast
import inspect
import re
import warnings
from dataclasses import dataclass, field

import blueprint._factories as factories
import blueprint.optim as optim
from blueprint._errors import ConfigError
from blueprint._layer import BlockStyle, BluePrint, Kind

QUOTE_LIMIT = 120   # characters of the offending text quoted in an error
MAX_TEXT_CHARS = 1_000_000   # a whole text (the zoo's longest model prints in under 1,500)
MAX_STRING_CHARS = 1_000     # one quoted string literal, quotes included (a layer name)

# Names `repr` prints, each derived from the table it comes from (never a hand list).
FACTORIES = {kind.value: getattr(factories, kind.value) for kind in Kind}
CONFIG_CLASSES = {name: getattr(optim, name) for name in optim.__all__ if inspect.isclass(getattr(optim, name))}
CONSTANTS = {"True": True, "False": False, "None": None}

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<string>['"])
  | (?P<punct>[()\[\],.\-])
""", re.VERBOSE)
# A string's body is scanned run by run (one match per run of plain characters or escape), never with
# one regex repetition per character: the regex engine keeps ~230 bytes of state per repetition.
_STRING_RUN = {"'": re.compile(r"[^'\\\n]*(?:\\[^\n])?"), '"': re.compile(r'[^"\\\n]*(?:\\[^\n])?')}
_CLOSER = {"(": ")", "[": "]"}


@dataclass(frozen=True)
class _Callee:
    """Something the text may call: a factory, BluePrint, a config class or a bound builder method."""

    label: str
    function: object
    returns: type | None = None   # a builder must return a value of this class


@dataclass(frozen=True)
class _StyleNamespace:
    """The name ``BlockStyle``: only its members may follow."""


@dataclass
class _Frame:
    opener: str                       # "(" for a call or parentheses, "[" for a list, "" for the whole text
    callee: _Callee | None = None
    items: list = field(default_factory=list)
    comma: bool = False


def parse_value(text: str, what: str = "value"):
    """The value that `text` (DSL code as `repr` prints it) stands for; never evaluates it.

    >>> parse_value("seq(conv(16, 3, 1, 1), bn(), relu())")
    seq(conv(16, 3, 1, 1), bn(), relu())
    >>> parse_value("SGD().lr(0.05).momentum(0.9)")
    SGD().lr(0.05).momentum(0.9)
    >>> parse_value("__import__('os').system('true')")
    Traceback (most recent call last):
    ...
    blueprint._errors.ConfigError: cannot read value "__import__('os').system('true')": unknown name '__import__' at character 0; expected DSL code as repr() prints it (factories, BluePrint, BlockStyle.X, optimizer/loss/scheduler configs, literals)
    """
    if not isinstance(text, str):
        raise ConfigError(f"cannot read {what}: expected DSL text (str), got {type(text).__name__}")
    return _Reader(text, what).read()


def parse_as(text: str, what: str, expected: tuple[type, ...]):
    """`parse_value`, then check the value is one of `expected` (e.g. a BluePrint for a model)."""
    value = parse_value(text, what)
    if not isinstance(value, expected):
        names = " or ".join(t.__name__ for t in expected)
        raise ConfigError(f"cannot read {what} {_quote(text)}: expected {names}, got {type(value).__name__}")
    return value


def _quote(text: str) -> str:
    short = text if len(text) <= QUOTE_LIMIT else text[:QUOTE_LIMIT] + "..."
    return '"' + short.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class _Reader:
    def __init__(self, text: str, what: str):
        self.text = text
        self.what = what
        self.tokens = self._tokenise()
        self.at = 0

    def fail(self, reason: str, position: int | None = None):
        where = f" at character {position}" if position is not None else ""
        raise ConfigError(f"cannot read {self.what} {_quote(self.text)}: {reason}{where}; expected DSL code as "
                          "repr() prints it (factories, BluePrint, BlockStyle.X, optimizer/loss/scheduler configs, "
                          "literals)")

    def _tokenise(self) -> list[tuple[str, str, int]]:
        if len(self.text) > MAX_TEXT_CHARS:
            raise ConfigError(f"cannot read {self.what}: the text has {len(self.text):,} characters; at most "
                              f"{MAX_TEXT_CHARS:,} are read (DSL code as repr() prints it is far shorter); the "
                              "file was corrupted or edited")
        tokens, position = [], 0
        while position < len(self.text):
            match = _TOKEN.match(self.text, position)
            if match is None:
                self.fail(f"unexpected {self.text[position]!r}", position)
            end = self._string_end(position) if match.lastgroup == "string" else match.end()
            if match.lastgroup != "space":
                tokens.append((match.lastgroup, self.text[position:end], position))
            position = end
        tokens.append(("end", "", len(self.text)))
        return tokens

    def _string_end(self, start: int) -> int:
        """The end of the string literal opened at `start`: linear in its length, constant memory."""
        quote, text = self.text[start], self.text
        run, position = _STRING_RUN[quote], start + 1
        while position - start <= MAX_STRING_CHARS:
            if position < len(text) and text[position] == quote:
                return position + 1
            end = run.match(text, position).end()
            if end == position:
                self.fail("unterminated string literal", start)
            position = end
        self.fail(f"string of more than {MAX_STRING_CHARS:,} characters (a layer name is far shorter)", start)

    def next(self) -> tuple[str, str, int]:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.at]

    # ---- the grammar, with an explicit stack ----------------------------------------------------
    def read(self):
        stack = [_Frame("")]
        value, state = None, "value"
        while True:
            if state == "open":                      # after '(' '[' or ',': a value or the closer
                kind, token, position = self.peek()
                frame = stack[-1]
                if kind == "punct" and token == _CLOSER.get(frame.opener):
                    self.next()
                    value, state = self._close(stack.pop(), position), "trailer"
                else:
                    state = "value"
            elif state == "value":
                kind, token, position = self.next()
                if kind == "punct" and token in _CLOSER:
                    stack.append(_Frame(token))
                    state = "open"
                    continue
                value, state = self._atom(kind, token, position), "trailer"
            elif state == "trailer":
                kind, token, position = self.peek()
                if kind == "punct" and token == ".":
                    self.next()
                    kind, name, position = self.next()
                    if kind != "name":
                        self.fail(f"expected a name after '.', found {name!r}", position)
                    value = self._attribute(value, name, position)
                elif kind == "punct" and token == "(":
                    self.next()
                    if not isinstance(value, _Callee):
                        self.fail(f"{type(value).__name__} value cannot be called", position)
                    stack.append(_Frame("(", callee=value))
                    state = "open"
                else:
                    state = "after"
            else:                                    # "after": a complete value inside the top frame
                frame = stack[-1]
                kind, token, position = self.next()
                if isinstance(value, (_Callee, _StyleNamespace)):
                    self.fail("a name without its call", position)
                frame.items.append(value)
                if not frame.opener:
                    if kind != "end":
                        self.fail(f"unexpected {token!r} after a complete value", position)
                    return value
                if kind == "punct" and token == ",":
                    frame.comma = True
                    state = "open"
                elif kind == "punct" and token == _CLOSER[frame.opener]:
                    stack.pop()
                    value, state = self._close(frame, position), "trailer"
                else:
                    found = "the end of the text" if kind == "end" else repr(token)
                    self.fail(f"expected ',' or {_CLOSER[frame.opener]!r}, found {found}", position)

    def _atom(self, kind: str, token: str, position: int):
        if kind == "number":
            return self._number(token, position)
        if kind == "punct" and token == "-":
            kind, token, position = self.next()
            if kind != "number":
                self.fail(f"'-' must be followed by a number, found {token!r}", position)
            return -self._number(token, position)
        if kind == "string":
            with warnings.catch_warnings():
                warnings.simplefilter("error")   # an invalid escape is refused, not guessed
                try:
                    return ast.literal_eval(token)   # one quoted string literal (matched above), nothing else
                except (SyntaxError, ValueError) as error:
                    self.fail(f"string {token!r} is not a valid literal ({error})", position)
        if kind == "name":
            if token in CONSTANTS:
                return CONSTANTS[token]
            if token in FACTORIES:
                return _Callee(token, FACTORIES[token])
            if token in CONFIG_CLASSES:
                return _Callee(token, CONFIG_CLASSES[token])
            if token == "BluePrint":
                return _Callee(token, BluePrint)
            if token == "BlockStyle":
                return _StyleNamespace()
            self.fail(f"unknown name {token!r}", position)
        found = "the end of the text" if kind == "end" else repr(token)
        self.fail(f"expected a value, found {found}", position)

    def _number(self, token: str, position: int):
        if any(c in token for c in ".eE"):
            return float(token)
        if len(token) > 1 and token[0] == "0":
            self.fail(f"integer {token!r} has a leading zero", position)
        try:
            return int(token)
        except ValueError as error:          # more digits than int() converts
            self.fail(f"integer literal of {len(token)} digits ({error})", position)

    def _attribute(self, value, name: str, position: int):
        if isinstance(value, _StyleNamespace):
            if name not in BlockStyle.__members__:
                self.fail(f"BlockStyle has no member {name!r} (members: {', '.join(BlockStyle.__members__)})",
                          position)
            return BlockStyle[name]
        cls = type(value)
        if cls in CONFIG_CLASSES.values() and not name.startswith("_"):
            method = inspect.getattr_static(cls, name, None)
            if inspect.isfunction(method):
                return _Callee(f"{cls.__name__}.{name}", getattr(value, name), returns=cls)
        self.fail(f"{cls.__name__} value has no builder method {name!r}", position)

    def _close(self, frame: _Frame, position: int):
        if frame.callee is not None:
            callee = frame.callee
            try:
                result = callee.function(*frame.items)
            except Exception as error:   # the factory's own message says which argument and why
                self.fail(f"{callee.label}(...) refused its arguments: {error}", position)
            if callee.returns is not None and not isinstance(result, callee.returns):
                self.fail(f"{callee.label}(...) is not a builder method (it returns {type(result).__name__})",
                          position)
            return result
        if frame.opener == "[":
            return list(frame.items)
        if len(frame.items) == 1 and not frame.comma:
            return frame.items[0]
        return tuple(frame.items)


__all__ = ["CONFIG_CLASSES", "ConfigError", "FACTORIES", "parse_as", "parse_value"]
