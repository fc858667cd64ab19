"""Build typed dataclasses from plain dicts (parsed TOML/JSON) with one-line errors.

Specs and training configs are plain dataclasses. Users write them as TOML or JSON, so a
wrong key or a value of the wrong type must be reported by its dotted field name
(``model.moe.top_k``) with what is allowed, not as a ``TypeError`` from a constructor.
Written here rather than pulled from pydantic because the rules are small and every level
(specs, train, lora, serve) shares them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

from legato.errors import LegatoError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

T = TypeVar("T")


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin in (tuple, list):
        return f"list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return "table"
    if dataclasses.is_dataclass(tp):
        return "table"
    return getattr(tp, "__name__", str(tp))


def convert(value: Any, tp: Any, where: str, error: type[LegatoError] = LegatoError) -> Any:
    """Convert ``value`` to type ``tp`` or raise ``error`` naming ``where``."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:  # Optional[X]: X's own error is the informative one
            return convert(value, non_none[0], where, error)
        for arg in args:
            if arg is type(None):
                continue
            try:
                return convert(value, arg, where, error)
            except LegatoError:
                continue
        raise error(f"{where}: expected {_type_name(tp)}, got {value!r}")
    if origin is typing.Literal:
        if value not in get_args(tp):
            raise error(f"{where}: must be one of {_type_name(tp)}, got {value!r}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise error(f"{where}: expected {_type_name(tp)}, got {value!r}")
        (item,) = get_args(tp)[:1]
        items = [convert(v, item, f"{where}[{i}]", error) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise error(f"{where}: expected a table, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise error(f"{where}: expected a table, got {value!r}")
        return from_dict(tp, value, where, error)
    if tp is bool:
        if not isinstance(value, bool):
            raise error(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise error(f"{where}: expected an integer, got {value!r}")
        if not -(2**63) <= value < 2**63:  # torch and numpy store integers in 64 bits
            raise error(f"{where}: must fit in 64 bits (-2**63 to 2**63 - 1), got {value}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise error(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise error(f"{where}: expected a string, got {value!r}")
        return value
    return value


# the spellings a boolean may take in a ``key=value`` string
FLAG_WORDS = {"0": False, "1": True, "false": False, "true": True}


def key_value_items(
    text: str, allowed: typing.Collection[str], where: str, error=LegatoError
) -> list[tuple[str, str]]:
    """The stripped ``(key, value)`` items of a string such as ``dp=8,tp=2``, in order;
    ``error`` naming the first item that is not ``key=value`` with an ``allowed`` key."""
    items = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = (x.strip() for x in item.partition("="))
        if not sep or key not in allowed:
            raise error(
                f"{where}: bad item {item!r}; expected key=value with key in {', '.join(allowed)}"
            )
        items.append((key, value))
    return items


def from_dict(cls: type[T], data: dict[str, Any], where: str = "", error=LegatoError) -> T:
    """Instantiate dataclass ``cls`` from ``data``; unknown keys and bad types are errors."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    prefix = f"{where}." if where else ""
    unknown = sorted(set(data) - set(fields))
    if unknown:
        allowed = ", ".join(sorted(fields))
        raise error(f"{prefix}{unknown[0]}: unknown field; allowed fields are {allowed}")
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = convert(data[name], hints[name], f"{prefix}{name}", error)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise error(f"{prefix}{name}: required field is missing")
    try:
        return cls(**kwargs)
    except LegatoError:
        raise
    except (TypeError, ValueError) as exc:
        raise error(f"{where or cls.__name__}: {exc}") from None


def to_dict(obj: Any) -> dict[str, Any]:
    """Plain-dict form of a dataclass (tuples become lists), for TOML/JSON output."""
    return json.loads(json.dumps(dataclasses.asdict(obj)))


def read_table_file(path: str | Path, error: type[LegatoError] = LegatoError) -> dict[str, Any]:
    """Read a TOML or JSON file into a dict, with a one-line error on any problem."""
    path = Path(path)
    kind = "JSON" if path.suffix == ".json" else "TOML"
    if path.is_dir():
        raise error(f"{path}: is a directory; expected a {kind} file")
    if not path.is_file():
        raise error(f"{path}: file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: not UTF-8 (byte {exc.start}); {kind} files must be UTF-8 text"
        ) from None
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(text) if kind == "JSON" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise error(f"{path}: malformed {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a table at the top level")
    return data


def toml_literal(value: Any) -> str:
    """``value`` (a bool, number, string, list or table) as a TOML literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML literal for {value!r}")
