"""Typed, frozen config dataclasses that YAML fills: the one schema engine of every config in lrl_jax.

A config is a frozen, keyword-only dataclass deriving from `Schema`. Its annotations are the schema:
`__post_init__` checks each field against its annotation (bool, int, float, str, Literal, Optional, tuple, or
a nested `Schema`), then runs the class's `_validate` rules. The same object is what the library takes (e.g.
`learner.LearnerConfig`, a static argument of the jit'd train step) and what a YAML section fills: there is
no second schema to map onto.

  @dataclasses.dataclass(frozen=True, kw_only=True)
  class Adam(Schema):
    section: ClassVar[str] = "opt"
    lr: float = 1e-3  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.999)  # β₁, β₂

    def _validate(self):
      self._check(self.lr > 0, "lr", "must be > 0")

  Adam.from_mapping({"lr": "3e-4"})  # Adam(lr=0.0003, ...); "lr" typed as "lrr" names 'lr' as the fix

Errors are `ConfigError`s (a `ValueError`) naming the dotted key the user typed (`opt.lr=-1.0 must be > 0`) and,
for an unknown key, the valid keys. A field whose value another config supplies (for instance the learner's
QAT spec, which the run config takes from its `quant` section) is marked `set_by(...)`: it is not a YAML key,
is not written by `to_dict`, and is given in Python or by the config that owns it.

Every field is declared on one line ending in a `# comment`: `describe` prints it as the key's help.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import re
import types
import typing
from typing import Any, ClassVar, Literal, Mapping, Sequence, Union

import yaml

__all__ = ["ConfigError", "Schema", "set_by", "describe", "parse_override", "merge_overrides", "check_regex", "suggest"]


class ConfigError(ValueError):
  """A config value or key is invalid; the message names the key and says what is valid."""


def set_by(owner: str, default: Any = None) -> Any:
  """A field that is not a YAML key: its value comes from `owner` (named in the error of a user who types it)."""
  return dataclasses.field(default=default, metadata={"set_by": owner})


def _owner(f: dataclasses.Field) -> str | None:
  return f.metadata.get("set_by")


@functools.cache
def _hints(cls) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def _is_schema(hint) -> bool:
  return isinstance(hint, type) and issubclass(hint, Schema)


def _schema_of(hint):
  """The config class of a nested-config annotation (`Sub` or `Sub | None`), else None."""
  if _is_schema(hint):
    return hint
  if typing.get_origin(hint) in (Union, types.UnionType):
    subs = [a for a in typing.get_args(hint) if _is_schema(a)]
    return subs[0] if len(subs) == 1 else None
  return None


def _type_name(hint) -> str:
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is Literal:
    return "one of " + ", ".join(str(a) for a in args)
  if origin in (Union, types.UnionType):
    return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
  if origin is tuple:
    if len(args) == 2 and args[1] is Ellipsis:
      return f"a list of {_type_name(args[0])}"
    return f"a list of {len(args)} values ({', '.join(_type_name(a) for a in args)})"
  if _is_schema(hint):
    return f"a mapping of {hint.section} keys"
  return {bool: "a bool (true / false)", int: "an int", float: "a float", str: "a string"}.get(hint, str(hint))


def _coerce(value, hint, key: str):
  """`value` checked against the annotation `hint` (ints widen to float, lists become tuples, mappings become
  nested configs)."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  bad = ConfigError(f"{key}={value!r} must be {_type_name(hint)}")
  if origin in (Union, types.UnionType):
    if value is None and type(None) in args:
      return None
    sub = _schema_of(hint)
    if sub is not None and isinstance(value, (Mapping, sub)):
      return _coerce(value, sub, key)  # a nested config's own error names its key
    for a in (a for a in args if a is not type(None)):
      try:
        return _coerce(value, a, key)
      except ConfigError:
        pass
    raise bad
  if origin is Literal:
    if any(type(value) is type(a) and value == a for a in args):
      return value
    raise bad
  if origin is tuple:
    if not isinstance(value, (list, tuple)):
      raise bad
    if len(args) == 2 and args[1] is Ellipsis:
      return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
      raise bad
    return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
  if _is_schema(hint):
    if isinstance(value, hint):
      return value
    if isinstance(value, Mapping):
      return hint.from_mapping(value)
    raise ConfigError(f"{key} must be {_type_name(hint)} (or a {hint.__name__}); got {type(value).__name__}")
  if hint is bool:
    if isinstance(value, bool):
      return value
    raise bad
  if hint is int:
    if isinstance(value, int) and not isinstance(value, bool):
      return value
    raise bad
  if hint is float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return float(value)
    if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
      try:
        return float(value)
      except ValueError:
        pass
    raise bad
  if hint is str:
    if isinstance(value, str):
      return value
    raise bad
  raise TypeError(f"{key}: unsupported annotation {hint!r}")  # a schema bug, not a user error


def _is_text(hint) -> bool:
  """Whether the field takes a string (str, or a Literal of strings), Optional or not."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin in (Union, types.UnionType):
    return any(_is_text(a) for a in args if a is not type(None))
  if origin is Literal:
    return all(isinstance(a, str) for a in args)
  return hint is str


def suggest(name: str, valid: Sequence[str]) -> str:
  """' (did you mean X?)' for the closest of `valid`, or ''."""
  close = difflib.get_close_matches(name, valid, n=1)
  return f" (did you mean {close[0]!r}?)" if close else ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Schema:
  """Base of every config: type-checks each field against its annotation, then runs `_validate`.

  `section` is the dotted key prefix of the class in messages ("learner", "learner.correction").
  """

  section: ClassVar[str] = ""

  def __post_init__(self):
    hints = _hints(type(self))
    for f in dataclasses.fields(self):
      if _owner(f) is None:
        object.__setattr__(self, f.name, _coerce(getattr(self, f.name), hints[f.name], self.key(f.name)))
    self._validate()

  def _validate(self) -> None:
    """Rules across fields (override; raise through `_check`)."""

  def key(self, name: str) -> str:
    """The dotted key of field `name` ("learner.lr")."""
    return f"{self.section}.{name}" if self.section else name

  def _check(self, ok: bool, name: str, rule: str) -> None:
    if not ok:
      raise ConfigError(f"{self.key(name)}={getattr(self, name)!r} {rule}")

  def replace(self, **changes):
    """A copy with `changes` (checked again)."""
    return dataclasses.replace(self, **changes)

  @classmethod
  def keys(cls) -> list[str]:
    """The YAML keys of this config (every field but the `set_by` ones)."""
    return [f.name for f in dataclasses.fields(cls) if _owner(f) is None]

  @classmethod
  def from_mapping(cls, data: Mapping[str, Any], **given):
    """The config of a YAML mapping (missing keys keep their defaults) plus `given` `set_by` fields."""
    if not isinstance(data, Mapping):
      raise ConfigError(f"section {cls.section!r} must be a mapping of keys to values; got {type(data).__name__}")
    keys = cls.keys()
    owners = {f.name: _owner(f) for f in dataclasses.fields(cls) if _owner(f)}
    for k in data:
      if k in owners:
        raise ConfigError(f"'{cls.section}.{k}' is not a config key: it is set by {owners[k]}")
      if k not in keys:
        raise ConfigError(
          f"unknown key '{cls.section}.{k}'{suggest(str(k), keys)}; valid keys in {cls.section}: {', '.join(keys)}"
        )
    return cls(**data, **given)

  def to_dict(self) -> dict[str, Any]:
    """{key: value} of the YAML keys, nested configs as mappings and tuples as lists (YAML-ready)."""
    out = {}
    for f in dataclasses.fields(self):
      if _owner(f) is not None:
        continue
      v = getattr(self, f.name)
      out[f.name] = v.to_dict() if isinstance(v, Schema) else list(v) if isinstance(v, tuple) else v
    return out


def check_regex(config: Schema, name: str) -> None:
  """Raises ConfigError if field `name` of `config` is not a valid regular expression."""
  try:
    re.compile(getattr(config, name))
  except (re.error, TypeError) as e:
    raise ConfigError(f"{config.key(name)}={getattr(config, name)!r} is not a valid regex ({e})") from None


# --------------------------------------------------------------------------- overrides


def parse_override(item: str, sections: Mapping[str, type[Schema]]) -> tuple[tuple[str, ...], Any]:
  """`a.b.c=value` -> (("a", "b", "c"), value): the key checked against `sections` (and the nested configs
  below them), the value parsed with `yaml.safe_load` (text fields keep the text as written)."""
  if "=" not in item:
    raise ConfigError(f"override {item!r} must be section.key=value (e.g. learner.lr=1e-4)")
  key, raw = item.split("=", 1)
  key = key.strip()
  path = tuple(key.split("."))
  if len(path) < 2 or not all(path):
    raise ConfigError(f"override key {key!r} must be section.key; valid sections: {', '.join(sections)}")
  if path[0] not in sections:
    raise ConfigError(
      f"unknown section {path[0]!r} in override {item!r}{suggest(path[0], sections)}; "
      f"valid sections: {', '.join(sections)}"
    )
  cls: type[Schema] = sections[path[0]]
  for i, name in enumerate(path[1:], start=1):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    where = ".".join(path[:i])
    if name in fields and _owner(fields[name]):
      raise ConfigError(f"'{where}.{name}' is not a config key: it is set by {_owner(fields[name])}")
    if name not in fields:
      keys = cls.keys()
      raise ConfigError(f"unknown key '{where}.{name}'{suggest(name, keys)}; valid keys in {where}: {', '.join(keys)}")
    hint = _hints(cls)[name]
    if i < len(path) - 1:
      if _schema_of(hint) is None:
        raise ConfigError(f"override key {key!r}: '{where}.{name}' is a value, not a section")
      cls = _schema_of(hint)
  try:
    value = yaml.safe_load(raw)
  except yaml.YAMLError:
    value = raw
  sub = _schema_of(hint)
  if sub is not None:
    if value is None and not _is_schema(hint):  # an optional section may be switched off
      return path, None
    raise ConfigError(
      f"override key {key!r} is a section; set one of its keys ({key}.{sub.keys()[0]}=...)"
      + ("" if _is_schema(hint) else f" or switch it off with {key}=null")
    )
  # A text field takes the text as written ("task.user_template=12" is "12"; "null" is still null).
  if (
    _is_text(hint)
    and not isinstance(value, str)
    and not (value is None and raw.strip() in ("null", "~", "Null", "NULL"))
  ):
    value = raw
  return path, value


def merge_overrides(data: Mapping[str, Any], overrides: Sequence[str], sections: Mapping[str, type[Schema]]) -> dict:
  """`data` ({section: {key: value}}, nested) with the overrides applied in order (later ones win)."""

  def copy(d):
    return {k: copy(v) if isinstance(v, Mapping) else v for k, v in d.items()}

  out = copy(data)
  for item in overrides:
    path, value = parse_override(item, sections)
    node = out
    for name in path[:-1]:
      if not isinstance(node.get(name), dict):
        node[name] = {}
      node = node[name]
    node[path[-1]] = value
  return out


# --------------------------------------------------------------------------- help


@functools.cache
def field_comments(cls) -> dict[str, str]:
  """The one-line comment of each field, read from the class's source (no second copy of the schema)."""
  out = {}
  for line in inspect.getsource(cls).splitlines():
    m = re.match(r"\s+(\w+): [^#]*?#\s*(.*)$", line)
    if m:
      out[m.group(1)] = m.group(2)
  return out


def describe(sections: Mapping[str, type[Schema]]) -> str:
  """Every section and key with its type, default and comment (nested configs indented)."""
  lines = []

  def visit(cls, indent: str):
    comments = field_comments(cls)
    for f in dataclasses.fields(cls):
      if _owner(f):
        continue
      hint = _hints(cls)[f.name]
      sub = _schema_of(hint)
      if sub is not None:
        off = "" if _is_schema(hint) else f" (default {f.default!r}: off; set a key to switch it on)"
        lines.append(f"{indent}{f.name}:  # {(sub.__doc__ or '').strip().splitlines()[0]}{off}")
        visit(sub, indent + "  ")
        continue
      default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
      lines.append(f"{indent}{f.name}: {default!r}  # {_type_name(hint)}. {comments.get(f.name, '')}")

  for name, cls in sections.items():
    lines.append(f"{name}:  # {(cls.__doc__ or '').strip().splitlines()[0]}")
    visit(cls, "  ")
  return "\n".join(lines)
