"""The machinery under every config section: type checks, dict and TOML round trips."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return " | ".join(repr(c) for c in typing.get_args(hint))
    if isinstance(hint, type):
        return hint.__name__
    return str(hint)


def _options(hint: Any) -> tuple:
    """The alternatives of a union hint (``int | None`` -> (int, NoneType)), else (hint,)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def coerce(name: str, value: Any, hint: Any) -> Any:
    """Check ``value`` against the type ``hint`` and return it (ints are accepted as floats).

    Raises ``ValueError`` naming the field when the value does not fit.
    """
    options = _options(hint)
    if len(options) > 1:
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(name, value, option)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[0] if len(errors) == 1 else f"{name} ({value!r}) must be {hint}")
    if isinstance(hint, type) and issubclass(hint, ConfigBase):  # a section of its own
        if isinstance(value, hint):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{name} ({value!r}) must be a section, [{hint.SECTION}]")
        try:
            return hint.from_dict(value)
        except ValueError as e:
            message = str(e)
            raise ValueError(message if message.startswith("unknown key")
                             else f"[{hint.SECTION}] {message}") from None
    origin = typing.get_origin(hint)
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise ValueError(f"{name} ({value!r}) must be one of {_describe(hint)}")
        return value
    if origin in (list, tuple):
        (item,) = typing.get_args(hint)[:1]
        if isinstance(value, str) and item is str:
            value = [value]  # a single path where a list of paths is expected
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} ({value!r}) must be a list")
        return tuple(coerce(f"{name}[{i}]", v, item) for i, v in enumerate(value))
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} ({value!r}) must be a number")
        if not math.isfinite(value):
            raise ValueError(f"{name} ({value!r}) must be a finite number")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} ({value!r}) must be an integer")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} ({value!r}) must be true or false")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{name} ({value!r}) must be a string")
        return value
    raise TypeError(f"unsupported config type for {name}: {hint}")  # a bug in this file


TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def parse_text(text: str, hint: Any) -> Any:
    """The value a command-line string stands for, by the field's type hint (the counterpart
    of :func:`coerce` for text): ``none`` for optional fields, booleans as true/false/yes/no,
    numbers, comma-separated lists. Raises ``ValueError`` when no alternative fits."""
    options = _options(hint)
    if text.lower() in ("none", "null") and type(None) in options:
        return None
    for option in options:
        origin = typing.get_origin(option)
        if option is bool and text.lower() in TRUE + FALSE:
            return text.lower() in TRUE
        if option in (int, float):
            try:
                return option(text)
            except ValueError:
                continue
        if origin in (list, tuple):
            return [part for part in text.split(",") if part]
        if option is str or origin is Literal:
            return text
    raise ValueError(f"expected {_describe(hint)}")


def unknown_key_error(section: str, key: str, known: typing.Iterable[str]) -> ValueError:
    """``ValueError`` for an unknown key, suggesting the closest known name."""
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    where = f"[{section}] " if section else ""
    return ValueError(f"unknown key {where}'{key}'{hint}")


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, once a class: it evaluates every annotation's text
    anew at each call, and every section made (a translation's decoding options, each call)
    reads them."""
    return typing.get_type_hints(cls)


class ConfigBase:
    """Shared behaviour of the frozen config dataclasses: type checks, defaults that follow
    another field, and dict round trips."""

    SECTION = ""

    def __post_init__(self) -> None:
        hints = type_hints(type(self))
        for f in dataclasses.fields(self):
            value = coerce(f.name, getattr(self, f.name), hints[f.name])
            if isinstance(value, int) and not -2**63 <= value < 2**63:  # bool is 0 or 1
                raise ValueError(f"{f.name} ({value}) is out of range: an integer setting is "
                                 "at most 2**63 - 1")
            object.__setattr__(self, f.name, value)
        follows = self.follows()
        followed = frozenset(name for name in follows
                             if "." not in name and getattr(self, name) is None)
        for name in followed:
            object.__setattr__(self, name, follows[name])
        object.__setattr__(self, "_followed", followed)
        for name, value in follows.items():  # "section.field": a section's field follows
            section, dot, key = name.partition(".")
            if dot:
                object.__setattr__(self, section, getattr(self, section).following(key, value))
        self.validate()

    def validate(self) -> None:
        """Cross-field checks; subclasses override."""

    def follows(self) -> dict[str, Any]:
        """Fields whose ``None`` means "the value of another field": ``{field: that value}``.
        They are filled in once, when the object is built, so the rest of vaswani reads one
        name per concept. ``"section.field"`` names a field of a section of this one.
        Subclasses override."""
        return {}

    @classmethod
    def parts(cls) -> dict[str, type[ConfigBase]]:
        """This section's own sections, by field name (``[model]``'s ``rope``, ...)."""
        hints = type_hints(cls)
        return {f.name: hints[f.name] for f in dataclasses.fields(cls)
                if isinstance(hints[f.name], type) and issubclass(hints[f.name], ConfigBase)}

    def following(self, name: str, value: Any):
        """This section with ``name`` set to ``value`` where it is None (or followed before),
        as the section it belongs to decides; a value given stays."""
        if getattr(self, name) is not None and name not in self._followed:
            return self
        copy = dataclasses.replace(self, **{name: value})
        object.__setattr__(copy, "_followed", copy._followed | {name})
        return copy

    def to_dict(self) -> dict[str, Any]:
        """Field values; a field that followed another is written as None (as it was given),
        so a saved config keeps following: a changed ``n_layers`` still moves it."""
        out = {}
        for f in dataclasses.fields(self):
            value = None if f.name in self._followed else getattr(self, f.name)
            if isinstance(value, ConfigBase):
                value = value.to_dict()
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        names = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in names:
                raise unknown_key_error(cls.SECTION, key, names)
        return cls(**data)

    def replace(self, **changes: Any):
        """A copy with ``changes``; fields that followed another follow it again."""
        again = {name: None for name in self._followed if name not in changes}
        return dataclasses.replace(self, **again, **changes)


# --- TOML -----------------------------------------------------------------------------------

def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")


def dump_toml(sections: dict[str, dict[str, Any]]) -> str:
    """Write ``{section: {key: scalar}}`` as TOML; a value that is itself a dict is a
    section's own section, written after it (``[model.rope]``). ``None`` values are left out
    (TOML has no null, and every field whose value may be None has None as its default)."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            if value is not None and not isinstance(value, dict):
                lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
        inner = {f"{section}.{key}": value for key, value in values.items()
                 if isinstance(value, dict)}
        if inner:
            lines.append(dump_toml(inner))
    return "\n".join(lines)


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; every problem (missing, a directory, not UTF-8, bad syntax) is an
    error that names the file."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a config file (give CONFIG.toml)")
    try:
        data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")  # a BOM some editors write
        return tomllib.loads(data.decode("utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"config file not found: {path}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a UTF-8 text file (byte 0x{e.object[e.start]:02x} "
                         f"at offset {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: invalid TOML: {e}") from None
