"""Type and range checking of the config's fields, and the JSON merge that applies overrides to them.

The type hints of a config dataclass drive one validator (`convert`), with ranges declared beside the
fields as `Annotated` markers (`Days` is `Annotated[int, Between(1, 3660)]`), so `"compile": "false"`,
`"surfaces": "feed"`, `epochs: 0` or `n_days: 100000000` fail at once with a `ConfigError` naming the
dotted key, the value and what is allowed, instead of misbehaving or failing late. Every number has an
upper bound too, far above any run (a cluster's included) but low enough to catch a typo. Each section
calls `validate` from its `__post_init__`, so construction in Python is checked like JSON.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from datetime import date, datetime
from typing import Annotated, Any, Literal


class ConfigError(ValueError):
    """A configuration value, key or file that cannot be used; the message names the dotted key
    (e.g. `train.epochs`) or the file, the value, and what is allowed."""


# Range and shape markers, declared beside a field: `epochs: Annotated[int, Between(1, 10_000)]`.
@dataclass(frozen=True)
class Between:
    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def admits(self, value: Any) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


@dataclass(frozen=True)
class OneOf:
    """A string that is one of `values` (for names kept in a tuple constant rather than a Literal)."""

    values: tuple[str, ...]

    def admits(self, value: Any) -> bool:
        return value in self.values

    def __str__(self) -> str:
        return f"one of {list(self.values)}"


@dataclass(frozen=True)
class NonEmpty:
    def admits(self, value: Any) -> bool:
        return len(value) > 0

    def __str__(self) -> str:
        return "non-empty"


@dataclass(frozen=True)
class Distinct:
    def admits(self, value: Any) -> bool:
        return len(set(value)) == len(value)

    def __str__(self) -> str:
        return "without duplicates"


# Every number is bounded above: far beyond any run of this pipeline, a cluster's included, yet low enough
# that a typo (an extra zero, a value meant for another key) fails here, not minutes into a run
# (`n_days: 100000000` took two minutes to end in an OverflowError of the calendar).
INT32_MAX = 2**31 - 1  # Spark int columns, tensor sizes and counts: beyond it something overflows
Count = Annotated[int, Between(1, INT32_MAX)]  # world sizes, rows, samples, steps, files, k
NonNegativeInt = Annotated[int, Between(0, INT32_MAX)]
Days = Annotated[int, Between(1, 3660)]  # ten years of daily partitions
NonNegativeDays = Annotated[int, Between(0, 3660)]
Processes = Annotated[int, Between(1, 4096)]  # processes on one node (torchrun --nproc-per-node)
Epochs = Annotated[int, Between(1, 10_000)]
BatchRows = Annotated[int, Between(1, 1 << 24)]  # rows one process holds at once (a batch, a chunk)
Width = Annotated[int, Between(1, 65_536)]  # dims, heads, ranks, experts, layers, CLS tokens
Tokens = Annotated[int, Between(1, 1 << 20)]  # sequence lengths, tokens a layer keeps
NonNegativeTokens = Annotated[int, Between(0, 1 << 20)]
Seed = Annotated[int, Between(0, 2**32 - 1)]  # fits every RNG here (torch, NumPy, a Spark bigint), + rank too
Buckets = Annotated[int, Between(2, INT32_MAX)]  # values land in rows 1..buckets-1; row 0 is the missing value
LearningRate = Annotated[float, Between(0, 10, low_open=True)]
Temperature = Annotated[float, Between(0, 100, low_open=True)]
Weight = Annotated[float, Between(0, 1000)]  # loss weights and penalties (weight decays)
Positive = Annotated[float, Between(0, 1_000_000, low_open=True)]  # rates and scales
Fraction = Annotated[float, Between(0, 1)]
Rate = Annotated[float, Between(0, 1, high_open=True)]  # a share of rows that must leave some rows alone
Name = Annotated[str, NonEmpty()]
Names = Annotated[tuple[Name, ...], NonEmpty(), Distinct()]


# The validator: type hints say what a field is, `Annotated` markers what range it may take.
def validate(obj: Any, where: str) -> None:
    """Type- and range-check every field of a config dataclass from its type hints; called by each
    `__post_init__`, so direct construction in Python is checked like JSON. Normalises in place what
    JSON cannot say exactly (a list for a tuple, an ISO string for a date, an int for a float)."""
    hints = type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        converted = convert(value, hints[f.name], _join(where, f.name))
        if converted is not value:
            object.__setattr__(obj, f.name, converted)


def convert(value: Any, hint: Any, where: str) -> Any:
    """`value` checked against `hint` (and its markers) and normalised; a ConfigError naming `where` otherwise."""
    kind, marks = split_hint(hint)
    origin = typing.get_origin(kind)

    def wrong_type() -> ConfigError:
        return ConfigError(f"{where}={show(value)}: must be {describe(hint)}, not {kind_of(value)}")

    if kind is bool:
        if not isinstance(value, bool):
            raise wrong_type()
        out = value
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong_type()
        out = value
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong_type()
        out = float(value)
        if not math.isfinite(out):
            raise ConfigError(f"{where}={show(value)}: must be {describe(hint)} (a finite number)")
    elif kind is str:
        if not isinstance(value, str):
            raise wrong_type()
        out = value
    elif kind is date:
        if isinstance(value, str):
            try:
                out = date.fromisoformat(value)
            except ValueError:
                raise ConfigError(f"{where}={show(value)}: must be {describe(hint)}") from None
        elif isinstance(value, date) and not isinstance(value, datetime):
            out = value
        else:
            raise wrong_type()
    elif origin is Literal:
        if not any(type(value) is type(choice) and value == choice for choice in typing.get_args(kind)):
            raise ConfigError(f"{where}={show(value)}: must be {describe(hint)}")
        out = value
    elif origin is tuple:
        # A string is a sequence too, but never a tuple field's value: "feed" is not ("feed",).
        if not isinstance(value, (list, tuple)):
            raise wrong_type()
        args = typing.get_args(kind)
        if len(args) == 2 and args[1] is Ellipsis:
            elements = (args[0],) * len(value)
        elif len(value) != len(args):
            raise ConfigError(f"{where}={show(value)}: must be {describe(hint)}, not an array of {len(value)}")
        else:
            elements = args
        out = tuple(convert(v, h, f"{where}[{i}]") for i, (h, v) in enumerate(zip(elements, value)))
        if isinstance(value, tuple) and all(a is b for a, b in zip(out, value)):
            out = value
    elif dataclasses.is_dataclass(kind):
        if isinstance(value, dict):
            out = _build(kind, value, where)
        elif isinstance(value, kind):
            out = value
        else:
            raise wrong_type()
    else:  # a field type this validator does not know: a programming error, not a user's
        raise TypeError(f"{where}: unsupported config field type {kind!r}")
    for mark in marks:
        if not mark.admits(out):
            raise ConfigError(f"{where}={show(value)}: must be {describe(hint)}")
    return out


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    """A `cls` from a complete JSON object (an element of a tuple of dataclasses, e.g. a SparseFeature)."""
    hints, fields = type_hints(cls), dataclasses.fields(cls)
    names = {f.name for f in fields}
    unknown = sorted(set(data) - names)
    missing = [
        f.name
        for f in fields
        if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if unknown or missing:
        raise ConfigError(
            f"{_in(where)}: "
            + "; ".join(
                ([f"unknown key(s) {unknown}"] if unknown else []) + ([f"missing key(s) {missing}"] if missing else [])
            )
            + f"; valid keys are {sorted(names)}"
        )
    return cls(**{k: convert(v, hints[k], _join(where, k)) for k, v in data.items()})


def describe(hint: Any) -> str:
    """What a hint allows, in the words of a JSON file: `an integer in [1, 3660]`, `true or false (a JSON
    boolean)`."""
    kind, marks = split_hint(hint)
    origin = typing.get_origin(kind)
    bounds = " and ".join(str(m) for m in marks if isinstance(m, Between))
    if kind is bool:
        return "true or false (a JSON boolean)"
    if kind is int:
        return f"an integer {bounds}".rstrip()
    if kind is float:
        return f"a number {bounds}".rstrip()
    if kind is str:
        choices = [m for m in marks if isinstance(m, OneOf)]
        if choices:
            return str(choices[0])
        return "a non-empty string" if any(isinstance(m, NonEmpty) for m in marks) else "a string"
    if kind is date:
        return "an ISO date string (YYYY-MM-DD)"
    if origin is Literal:
        return f"one of {list(typing.get_args(kind))}"
    if origin is tuple:
        args = typing.get_args(kind)
        non_empty = "non-empty " if any(isinstance(m, NonEmpty) for m in marks) else ""
        distinct = " without duplicates" if any(isinstance(m, Distinct) for m in marks) else ""
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a {non_empty}JSON array{distinct}, each element {describe(args[0])}"
        each = {describe(a) for a in args}
        if len(args) == 1:
            return f"a JSON array of exactly one element, {each.pop()}"
        if len(each) == 1:
            return f"a JSON array of exactly {len(args)} elements{distinct}, each {each.pop()}"
        return f"a JSON array of exactly {len(args)} elements: " + ", ".join(describe(a) for a in args)
    if dataclasses.is_dataclass(kind):
        return f"a JSON object of {kind.__name__} settings"
    return repr(kind)


def kind_of(value: Any) -> str:
    if dataclasses.is_dataclass(value):
        return f"a {type(value).__name__}"
    for types, name in (
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a float"),
        (str, "a string"),
        ((list, tuple), "an array"),
        (dict, "an object"),
        (type(None), "null"),
    ):
        if isinstance(value, types):
            return name
    return f"a {type(value).__name__}"


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def split_hint(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    """(type, markers) of a possibly `Annotated` hint."""
    if typing.get_origin(hint) is Annotated:
        return hint.__origin__, hint.__metadata__
    return hint, ()


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _in(where: str) -> str:
    """How structural errors (unknown or missing keys) name a section: `config.world`, `config`."""
    return f"config.{where}" if where else "config"


def merge(obj: Any, data: Any, where: str) -> Any:
    """`obj` (a config dataclass) with the JSON `data` applied: nested sections merge, other values replace."""
    cls = type(obj)
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}={show(data)}: must be {describe(cls)}, not {kind_of(data)}")
    hints, fields = type_hints(cls), {f.name for f in dataclasses.fields(obj)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ConfigError(f"{_in(where)}: unknown key(s) {unknown}; valid keys are {sorted(fields)}")
    changes = {}
    for key, value in data.items():
        path, current = _join(where, key), getattr(obj, key)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            changes[key] = merge(current, value, path)
        else:
            changes[key] = convert(value, hints[key], path)
    return dataclasses.replace(obj, **changes)
