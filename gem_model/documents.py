"""Strict reading of the small documents people write: source mappings (YAML or JSON) and config files (JSON).

Such a file may come from anyone, so it is refused, with a `DocumentError` saying where and why, when it
is larger than `MAX_BYTES`, compressed, binary or not UTF-8, nested deeper than `MAX_DEPTH`, or repeats
a key within one object (both parsers would keep the last copy silently). YAML is read without anchors,
aliases and tags: an alias bomb expands a few lines into gigabytes, and an error message quoting the
value would print them. Its plain scalars follow YAML 1.2's core schema, stricter: only `true` and
`false` are booleans, `null`, `~` and nothing are null, and only an integer written as its canonical
digits (`0`, `7`, `-12`) is an integer, so `yes`, `no`, `on`, `off`, `07`, `1.0` or `2024-01-01` stay
the text written. Depth and duplicates are found before any Python object is built (on the parser's
events, or on the JSON text's tokens), so a 50,000-deep document is an error, not a RecursionError.
Messages give line numbers, never the document's content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

# Far above any mapping or config written by hand (the built-in mappings: under 5 KiB, 3 levels deep).
MAX_BYTES = 1 << 20
MAX_DEPTH = 50


class DocumentError(ValueError):
    """A document that cannot be read safely; the message says where (a line), what is wrong and the fix,
    and the caller puts the file's name before it."""


def read_document(path: Path) -> str:
    """The text of the file at `path` if it is UTF-8 text of at most MAX_BYTES; OSError if it cannot be read."""
    with path.open("rb") as fh:
        data = fh.read(MAX_BYTES + 1)  # bounded: the path may name a device or a huge file
    if len(data) > MAX_BYTES:
        raise DocumentError(
            f"is larger than {MAX_BYTES} bytes, far more than any hand-written document; point at the right file"
        )
    if data.startswith(b"\x1f\x8b"):
        raise DocumentError("is gzip-compressed; decompress it: it must be UTF-8 text")
    if b"\x00" in data:
        line = data.count(b"\n", 0, data.index(b"\x00")) + 1
        raise DocumentError(f"is binary (a NUL byte at line {line}); it must be UTF-8 text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DocumentError(
            f"is not UTF-8 text (byte 0x{data[e.start]:02x} at line {line}); save it as UTF-8 "
            "(e.g. `iconv -f latin1 -t utf-8`)"
        ) from None


def load_json(text: str) -> Any:
    """The JSON value of `text`, checked for depth and duplicate keys before it is built."""
    _check_json_tokens(text)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DocumentError(
            f"is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}; fix the syntax there"
        ) from None


def load_yaml(text: str) -> Any:
    """The YAML value of `text` (one document), read by the rules of the module docstring."""
    try:
        _check_yaml_events(text)
        loader = _StrictLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise DocumentError(f"is not valid YAML: {e.problem or e.context}{where}; fix the syntax there") from None
    except yaml.YAMLError as e:  # the reader's errors name a character code and a position, no content
        raise DocumentError(f"is not valid YAML: {e}; fix the syntax there") from None


# JSON: a string (a key when a colon follows it) or a bracket; everything else is skipped.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"(\s*:)?|[\[\]{}]')


def _check_json_tokens(text: str) -> None:
    """DocumentError at the first bracket nested deeper than MAX_DEPTH, or the first key repeated in its object."""
    objects: list[dict[str, int] | None] = []  # per open bracket: an object's keys -> their lines; None: an array
    for token in _JSON_TOKEN.finditer(text):
        first = token.group()[0]
        if first in "[{":
            if len(objects) == MAX_DEPTH:
                raise DocumentError(
                    f"nests deeper than {MAX_DEPTH} levels at line {_line(text, token.start())}; flatten it"
                )
            objects.append({} if first == "{" else None)
        elif first in "]}":
            if objects:
                objects.pop()
        elif token.group(1) and objects and objects[-1] is not None:
            key, line = json.loads(token.group()[: -len(token.group(1))]), _line(text, token.start())
            if key in objects[-1]:
                raise _repeated(key, objects[-1][key], line)
            objects[-1][key] = line


def _line(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


def _repeated(key: Any, first_line: int, line: int) -> DocumentError:
    shown = repr(key) if len(repr(key)) <= 40 else repr(key)[:37] + "..."
    return DocumentError(
        f"repeats the key {shown} at line {line}, first given at line {first_line} (only one "
        "copy would be kept, silently); keep one"
    )


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # the C parser where PyYAML has libyaml
    """YAML's safe loader with YAML 1.2's core scalars, stricter (module docstring), refusing duplicate keys."""

    yaml_implicit_resolvers: dict[str | None, list[tuple[str, re.Pattern[str]]]] = {}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            key, line = self.construct_object(key_node, deep=deep), key_node.start_mark.line + 1
            if not isinstance(key, Hashable):
                raise DocumentError(f"has a list or mapping as a key at line {line}; keys are names")
            if key in lines:
                raise _repeated(key, lines[key], line)
            lines[key] = line
        return super().construct_mapping(node, deep=deep)


for _tag, _pattern, _first in (
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("int", r"^(?:0|-?[1-9][0-9]*)$", "-0123456789"),  # canonical only: str() of the value is its text
    ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
):
    _StrictLoader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(_pattern), list(_first))


def _check_yaml_events(text: str) -> None:
    """DocumentError at the first anchor, alias, tag, collection deeper than MAX_DEPTH or second document."""
    depth, documents = 0, 0
    for event in yaml.parse(text, Loader=_StrictLoader):
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise DocumentError(
                f"uses an anchor or alias (& or *) at line {line}; write the value out in full: "
                "anchors and aliases are not read"
            )
        if getattr(event, "tag", None):
            raise DocumentError(f"uses a tag (!...) at line {line}; drop it, and quote a value that must stay text")
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise DocumentError(f"holds a second YAML document at line {line}; keep one")
        elif isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise DocumentError(f"nests deeper than {MAX_DEPTH} levels at line {line}; flatten it")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
