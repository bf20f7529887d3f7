"""The generic half of ``runnel.config``: sources, coercion to typed values, and rendering.

How this works. Two sources give raw settings: a TOML file (top-level keys, then one table per
section) and environment variables (``RUNNEL_<KEY>``, ``RUNNEL_<SECTION>__<KEY>``). Each raw
value is kept with its source (the file's path, or ``env`` and the variable's name) in a
``Layer``, ``{section: {key: Setting}}``, where section ``""`` is the top level; the
environment's layer is laid over the file's. A ``Schema`` (section -> key -> type hint, read
from the dataclasses' annotations) says what is known: ``unknown_keys`` reports the rest with
the closest known spelling. ``coerce`` turns a value into its field's type: a TOML value must
already have the right type (a list may also be one comma-separated string); text from the
environment is parsed. ``build`` makes a section's dataclass, whose own ``__post_init__``
validates it, and pins each ValueError on the key the message names.

Nothing here raises for a bad setting: problems are collected in a list so that the caller can
report them all in one ``ConfigError``. Only an unreadable or malformed file stops at once.
This module knows nothing of the node's fields; ``runnel.config`` holds the model.
"""

from __future__ import annotations

import difflib
import enum
import json
import re
import tomllib
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

__all__ = [
    "TOP",
    "ConfigError",
    "Layer",
    "Problem",
    "Schema",
    "Setting",
    "build",
    "coerce",
    "coerce_all",
    "dotted",
    "env_name",
    "overlay",
    "plain",
    "read_env",
    "read_toml",
    "toml_line",
    "unknown_keys",
]

T = TypeVar("T")
TOP = ""  # the section of top-level keys
ENV_PREFIX = "RUNNEL_"
ENV_SECTION_SEPARATOR = "__"
_NONE_TEXTS = frozenset({"", "none"})  # how the environment says "not set"


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason the configuration cannot be used."""

    key: str  # dotted: "node_id", "raft.election_timeout_ms"
    source: str  # a file's path, "env RUNNEL_…", "default", or "" when unknown
    message: str

    def __str__(self) -> str:
        where = f" ({self.source})" if self.source else ""
        return f"{self.key}{where}: {self.message}"


class ConfigError(ValueError):
    """The configuration cannot be used; ``problems`` lists every reason found."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = tuple(problems)
        count = len(self.problems)
        head = "invalid configuration" + (f" ({count} problems)" if count > 1 else "")
        super().__init__(head + ":\n  " + "\n  ".join(map(str, self.problems)))


@dataclass(frozen=True, slots=True)
class Setting:
    """One raw value and where it came from."""

    value: object
    source: str
    from_env: bool  # text to parse, rather than a typed TOML value


Layer = dict[str, dict[str, Setting]]
Schema = Mapping[str, Mapping[str, Any]]  # section -> key -> type hint


def dotted(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


def env_name(section: str, key: str) -> str:
    """The variable that sets ``key`` of ``section`` (``TOP`` for a top-level key)."""
    name = f"{section}{ENV_SECTION_SEPARATOR}{key}" if section else key
    return ENV_PREFIX + name.upper()


# -- sources -----------------------------------------------------------------------------------


def read_toml(path: Path) -> Layer:
    """The file's settings; raises ConfigError if it cannot be read or is not TOML."""
    source = str(path)
    try:
        with path.open("rb") as file:
            document = tomllib.load(file)
    except OSError as e:
        raise ConfigError([Problem("config file", source, f"cannot read: {e}")]) from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([Problem("config file", source, f"not valid TOML: {e}")]) from e
    except UnicodeDecodeError as e:  # TOML is UTF-8 text
        raise ConfigError([Problem("config file", source, f"not UTF-8 text: {e}")]) from e
    layer: Layer = {TOP: {}}
    for key, value in document.items():
        if isinstance(value, dict):
            layer[key] = {k: Setting(v, source, False) for k, v in value.items()}
        else:
            layer[TOP][key] = Setting(value, source, False)
    return layer


def read_env(env: Mapping[str, str], ignore: frozenset[str]) -> Layer:
    """The ``RUNNEL_*`` variables of ``env`` except those in ``ignore``."""
    layer: Layer = {TOP: {}}
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in ignore:
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        section, _, key = rest.rpartition(ENV_SECTION_SEPARATOR)
        layer.setdefault(section, {})[key] = Setting(env[name], f"env {name}", True)
    return layer


def overlay(base: Layer, top: Layer) -> Layer:
    """``base`` with every setting of ``top`` put over it."""
    merged = {section: dict(settings) for section, settings in base.items()}
    for section, settings in top.items():
        merged.setdefault(section, {}).update(settings)
    return merged


def unknown_keys(layer: Layer, schema: Schema) -> list[Problem]:
    """One problem per unknown setting, suggesting what was probably meant."""
    problems = []
    for section, settings in layer.items():
        for key, setting in settings.items():
            if key not in schema.get(section, {}):
                what = "unknown key" if section in schema else f"unknown section [{section}]"
                guess = _suggest(section, key, setting.from_env, schema)
                hint = f"; did you mean {guess}?" if guess else ""
                problems.append(Problem(dotted(section, key), setting.source, what + hint))
    return problems


def _suggest(section: str, key: str, from_env: bool, schema: Schema) -> str | None:
    """The known key closest to ``key`` (in another section if it lives there), spelt the
    way its source spells keys."""
    homes = [s for s, keys in schema.items() if key in keys]
    if homes:
        section = homes[0]
        if section == TOP and not from_env:
            return f"the top-level {key} (above the first [section])"
    elif section not in schema:
        guesses = difflib.get_close_matches(section, [s for s in schema if s], n=1)
        if not guesses:
            return None
        section = guesses[0]
        keys = difflib.get_close_matches(key, list(schema[section]), n=1)
        key = keys[0] if keys else ""
    else:
        keys = difflib.get_close_matches(key, list(schema[section]), n=1)
        if not keys:
            return None
        key = keys[0]
    if not key:
        return f"[{section}]"
    return env_name(section, key) if from_env else dotted(section, key)


# -- coercion ----------------------------------------------------------------------------------


def coerce_all(
    section: str, settings: Mapping[str, Setting], hints: Mapping[str, Any], problems: list[Problem]
) -> dict[str, Any]:
    """The typed values of the known ``settings``; each one that does not fit is a problem."""
    values: dict[str, Any] = {}
    for key, setting in settings.items():
        if key not in hints:
            continue  # unknown_keys reports it
        try:
            values[key] = coerce(setting.value, hints[key], setting.from_env)
        except ValueError as e:
            problems.append(Problem(dotted(section, key), setting.source, str(e)))
    return values


def coerce(value: object, hint: Any, from_env: bool) -> Any:
    """``value`` as a ``hint``; raises ValueError saying what was expected."""
    origin = get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return _coerce_optional(value, hint, from_env)
    if origin is Literal:
        return _coerce_choice(value, get_args(hint))
    if origin is tuple or origin is frozenset:
        return _coerce_items(value, get_args(hint)[0], origin, from_env)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _coerce_enum(value, hint)
    if hint is bool:
        return _coerce_bool(value, from_env)
    if hint is int:
        return _scalar(value, int, "an integer", from_env)
    if hint is float:
        return float(_scalar(value, (int, float), "a number", from_env, parse=float))
    if hint is str:
        return _text(value)
    if hint is Path:
        return Path(_text(value))
    parse: Callable[[str], Any] | None = getattr(hint, "parse", None)
    if parse is None:
        raise TypeError(f"no coercion to {hint!r}")  # a field type this module does not know
    return parse(_text(value))


def _scalar(
    value: object,
    kind: type | tuple[type, ...],
    what: str,
    from_env: bool,
    parse: Callable[[str], Any] = int,
) -> Any:
    if from_env and isinstance(value, str):
        try:
            return parse(value.strip())
        except ValueError:
            raise ValueError(f"expected {what}, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"expected {what}, got {_show(value)}")
    return value


def _coerce_bool(value: object, from_env: bool) -> bool:
    if from_env and isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if isinstance(value, bool):
        return value
    raise ValueError(f"expected true or false, got {_show(value)}")


def _coerce_optional(value: object, hint: Any, from_env: bool) -> Any:
    """``X | None``: unset by ``none`` or an empty value in the environment, and by -1 for an
    integer (Kafka's spelling of "no limit")."""
    inner = next(arg for arg in get_args(hint) if arg is not type(None))
    if from_env and isinstance(value, str) and value.strip().lower() in _NONE_TEXTS:
        return None
    result = coerce(value, inner, from_env)
    return None if inner is int and result == -1 else result


def _coerce_choice(value: object, choices: Sequence[object]) -> object:
    if isinstance(value, str) and value.strip() in choices:
        return value.strip()
    raise ValueError(f"expected one of {', '.join(map(str, choices))}; got {_show(value)}")


def _coerce_enum(value: object, cls: type[enum.Enum]) -> enum.Enum:
    text = _normal(_text(value))
    for member in cls:
        if text in (_normal(member.name), _normal(str(member.value))):
            return member
    names = ", ".join(member.name.lower() for member in cls)
    raise ValueError(f"expected one of {names}; got {_show(value)}")


def _coerce_items(value: object, item: Any, container: type, from_env: bool) -> Any:
    """A list: a TOML array, or one string of comma-separated items (from a file or the
    environment). A set refuses an item named twice."""
    if isinstance(value, str):
        raw: list[object] = [part.strip() for part in value.split(",")] if value.strip() else []
        items = [coerce(part, item, True) for part in raw]
    elif isinstance(value, list) and not from_env:
        items = [coerce(part, item, False) for part in value]
    else:
        raise ValueError(f"expected a list, got {_show(value)}")
    if container is frozenset and len(set(items)) < len(items):
        twice = sorted({_show(plain(i)) for i in items if items.count(i) > 1})
        raise ValueError(f"names {', '.join(twice)} more than once")
    return container(items)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {_show(value)}")
    return value


def _normal(text: str) -> str:
    return re.sub(r"[-_ ]", "", text).lower()


def _show(value: object) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, str | int | float | bool | list):
        return json.dumps(value)
    return repr(value)


# -- building a section ------------------------------------------------------------------------


def build(
    cls: Callable[..., T],
    names: Sequence[str],
    section: str,
    values: Mapping[str, Any],
    sources: Mapping[str, str],
    problems: list[Problem],
) -> T:
    """``cls(**values)``, whose ``__post_init__`` validates. Each ValueError is pinned on the
    first key it names that was set (so a relation is blamed on the setting that broke it);
    that key falls back to its default and the rest is tried again, so every bad setting of
    the section is reported, not just the first."""
    pattern = re.compile(r"\b(" + "|".join(sorted(names, key=len, reverse=True)) + r")\b")
    kwargs = dict(values)
    while True:
        try:
            return cls(**kwargs)
        except ValueError as e:
            message = str(e)
            named = [m for m in pattern.findall(message) if m in kwargs]
            if not named:  # names no setting: report it on the section, keep the defaults
                problems.append(Problem(section, "", message))
                return cls()
            key = named[0]
            short = message.removeprefix(f"{key} ") if message.startswith(f"{key} ") else message
            problems.append(Problem(dotted(section, key), sources[key], short))
            del kwargs[key]


# -- rendering ---------------------------------------------------------------------------------


def plain(value: object) -> Any:
    """``value`` as TOML and JSON know it: enums by name, sets sorted, paths as text."""
    if isinstance(value, enum.Enum):
        return value.name.lower()
    if isinstance(value, frozenset):
        return sorted(plain(v) for v in value)
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, Path) or hasattr(type(value), "parse"):
        return str(value)
    return value


def toml_line(key: str, value: object, source: str | None, unset_by_minus_one: bool) -> str:
    """``key = value`` with the source as a comment. None is written -1 where that means
    unset (an integer whose default is a limit), otherwise as a comment."""
    if value is None and not unset_by_minus_one:
        return f"# {key} is not set"
    text = "-1" if value is None else _toml_value(plain(value))
    return f"{key} = {text}" + (f"  # {source}" if source else "")


def _toml_value(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)  # a JSON string, number or boolean is TOML too
