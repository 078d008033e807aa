"""Typed config trees: frozen dataclasses from nested dicts, back to dicts, and dotted overrides.

A config is a tree of frozen dataclasses whose fields are, by their type hints:

* a **section**: a dataclass, always present (``rl.budget``);
* an **optional section**: ``X | None`` with X a dataclass, None = off (``rl.anchor``);
* a **choice**: a ``Choice`` subclass, one entry of a ``jaxrl_vr.registry.Registry`` by
  name with that entry's own settings (``rl.estimator``: ``{"name": "curverl", "window": 10}``,
  or just ``"curverl"``);
* a **value**: bool, int, float, str, ``tuple[X, ...]`` or ``X | None``.

``from_tree`` builds and type-checks a tree (every key that is absent takes its
default, so a tree states only what it changes), ``to_tree`` writes one back (JSON-able),
and ``set_key`` applies one ``dotted.key=text`` override, parsing the text by the
key's type. Every mistake is a ``ConfigError`` that names the dotted key and, for an
unknown key, the closest valid one. No ml_collections here: that lives in experiments/.
"""

from __future__ import annotations

import ast
import dataclasses
import types
import typing
from typing import Any, Callable, ClassVar, Mapping

from jaxrl_vr.registry import Registry, closest, did_you_mean

__all__ = ["Choice", "ConfigError", "from_tree", "key_type", "parse_text", "set_key", "to_tree"]

NONE_SPELLINGS = ("None", "none", "null")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


class ConfigError(ValueError):
    """A config key or value that cannot be used (the message names the key and the fix)."""


@dataclasses.dataclass(frozen=True)
class Choice:
    """One entry of ``REGISTRY`` by name, with that entry's settings dataclass.

    Subclass per registry (``class EstimatorChoice(Choice): REGISTRY = ESTIMATORS``). In a
    tree a choice is ``{"name": ..., **settings}`` or just the name.
    """

    name: str
    settings: Any = None
    REGISTRY: ClassVar[Registry]

    def __post_init__(self):
        entry = self.REGISTRY[self.name]
        if self.settings is None:
            object.__setattr__(self, "settings", entry.settings())
        elif not isinstance(self.settings, entry.settings):
            raise TypeError(f"{self.REGISTRY.kind} {self.name!r} takes {entry.settings.__name__} "
                            f"settings, got {type(self.settings).__name__}.")

    @classmethod
    def of(cls, name: str, **settings) -> "Choice":
        """The choice ``name`` with these settings (the entry's defaults for the rest)."""
        return cls(name, cls.REGISTRY.settings(name, settings))


# ------------------------------------------------------------------------------ kinds


def _unwrap_optional(hint) -> tuple[Any, bool]:
    """(inner hint, True) for ``X | None``; (hint, False) otherwise."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def _is_choice(hint) -> bool:
    return isinstance(hint, type) and issubclass(hint, Choice)


def _is_section(hint) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint) and not _is_choice(hint)


def _section_of(hint):
    """The dataclass of a section or an optional section (``X | None``), else None."""
    if _is_section(hint):
        return hint
    inner, optional = _unwrap_optional(hint)
    return inner if optional and _is_section(inner) else None


def _choice_node(node) -> dict:
    """A choice as written in a tree (its name alone, a mapping, or absent) as a new dict."""
    return {"name": node} if isinstance(node, str) else dict(node or {})


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


# -------------------------------------------------------------------------- building


def dotted_keys(cls, prefix: str = "") -> list[str]:
    """Every dotted key of a config class (a choice: its name and its default's settings)."""
    out = []
    for name, field in _fields(cls).items():
        hint, key = _hints(cls)[name], f"{prefix}{name}"
        out.append(key)
        if _is_choice(hint):
            default = _default(field)
            settings = hint.REGISTRY[default.name].settings if isinstance(default, Choice) else None
            out += [f"{key}.name"] + (dotted_keys(settings, f"{key}.") if settings else [])
        elif _section_of(hint) is not None:
            out += dotted_keys(_section_of(hint), f"{key}.")
    return out


def _unknown_key(path: str, key: str, valid: list[str], moved: Callable[[str], str | None],
                 root=None) -> ConfigError:
    """The error of an unknown ``path + key``: where it moved, or the closest valid key (in
    its section, else the same name in another section of ``root``)."""
    full = f"{path}{key}"
    hint = moved(full) if moved else None
    if hint:
        return ConfigError(f"config key '{full}' moved: {hint}.")
    match = closest(key, valid)
    match = f"{path}{match}" if match else None
    if match is None and root is not None:
        elsewhere = [k for k in dotted_keys(root) if k.rpartition(".")[2] == key]
        match = elsewhere[0] if elsewhere else None
    suggestion = f"; did you mean '{match}'?" if match else ""
    where = path.rstrip(".") or "the top level"
    return ConfigError(f"unknown config key '{full}'{suggestion} Valid keys under {where}: "
                       f"{', '.join(sorted(valid))}.")


def _unknown_setting(choice_cls, name: str, key: str, path: str, moved, advice: str = "") -> ConfigError:
    """The error of a setting ``key`` that the ``choice_cls`` entry ``name`` (at ``path``) lacks:
    where it moved, or the closest setting it has."""
    hint = moved(f"{path}.{key}") if moved else None
    if hint:
        return ConfigError(f"config key '{path}.{key}' moved: {hint}.")
    valid = list(_fields(choice_cls.REGISTRY[name].settings))
    kind = choice_cls.REGISTRY.kind
    return ConfigError(f"{kind} {name!r} has no setting '{key}'{did_you_mean(key, valid)} (in config "
                       f"{path}); its settings: {', '.join(valid) or 'none'}.{advice}")


def from_tree(cls, tree: Mapping | None = None, path: str = "", *,
              moved: Callable[[str], str | None] | None = None, root=None):
    """The dataclass ``cls`` from a nested mapping (absent keys keep their defaults).

    Args:
      cls: a frozen config dataclass.
      tree: its values, nested by section (None = all defaults).
      path: the dotted prefix of ``tree`` in error messages.
      moved: ``full_key -> hint`` for keys that moved elsewhere (old config layouts).

    Raises:
      ConfigError naming the dotted key: an unknown key (with the closest valid one), a
      value of the wrong type, or a value the dataclass rejects.
    """
    tree = {} if tree is None else tree
    root = cls if root is None else root
    if not isinstance(tree, Mapping):
        raise ConfigError(f"config {path.rstrip('.') or '<root>'} must be a mapping of keys, got "
                          f"{type(tree).__name__} {tree!r}.")
    fields, hints = _fields(cls), _hints(cls)
    for key in tree:
        if key not in fields:
            raise _unknown_key(path, key, list(fields), moved, root)
    kwargs = {name: _build(hints[name], value, _default(fields[name]), f"{path}{name}", moved, root)
              for name, value in tree.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        if isinstance(err, ConfigError):
            raise
        # A section's messages start with the field they are about: prefix its dotted path.
        message = str(err)
        raise ConfigError(f"config {message if message.startswith(path) else path + message}") from None


def _build_choice(cls, value, default, path, moved, root):
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, Mapping):
        raise ConfigError(f"config {path} must be a {cls.REGISTRY.kind} name or a mapping with "
                          f"'name', got {value!r}.")
    name = value.get("name", default.name if isinstance(default, Choice) else None)
    if name not in cls.REGISTRY:
        raise ConfigError(f"config {path}.name: {cls.REGISTRY.unknown(name)}")
    settings_cls = cls.REGISTRY[name].settings
    rest = {k: v for k, v in value.items() if k != "name"}
    for key in rest:
        if key not in _fields(settings_cls):
            raise _unknown_setting(cls, name, key, path, moved)
    return cls(name, from_tree(settings_cls, rest, f"{path}.", moved=moved, root=root))


def _build(hint, value, default, path, moved, root):
    if _is_choice(hint):
        return _build_choice(hint, value, default, path, moved, root)
    if _is_section(hint):
        return value if isinstance(value, hint) else from_tree(hint, value, f"{path}.", moved=moved, root=root)
    inner = _section_of(hint)
    if inner is not None:  # an optional section
        if value is None or isinstance(value, inner):
            return value
        if not isinstance(value, Mapping):
            hint_text = moved(path) if moved else None
            raise ConfigError(f"config {path} is a section: give a mapping of its keys, or None for "
                              f"off; got {value!r}" + (f" ({hint_text})." if hint_text else "."))
        return from_tree(inner, value, f"{path}.", moved=moved, root=root)
    return _check_value(hint, value, path)


def _check_value(hint, value, path: str):
    """``value`` as the type ``hint`` asks (lists become tuples, integral floats ints)."""
    inner, optional = _unwrap_optional(hint)
    if value is None:
        if optional or hint is Any:
            return None
        raise ConfigError(f"config {path} cannot be None; give a {getattr(hint, '__name__', hint)}.")
    if optional:
        return _check_value(inner, value, path)
    origin = typing.get_origin(hint)
    if hint is tuple or origin is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"config {path} must be a list of values, got {value!r}.")
        args = typing.get_args(hint)
        item = args[0] if args and (len(args) == 1 or args[1] is Ellipsis) else Any
        return tuple(_check_value(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if hint is bool:
        if isinstance(value, bool) or type(value).__name__ == "bool_":
            return bool(value)
        raise ConfigError(f"config {path} must be True or False, got {value!r}.")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
            raise ConfigError(f"config {path} must be an integer, got {value!r}.")
        return int(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config {path} must be a number, got {value!r}.")
        return float(value)
    if hint is str and not isinstance(value, str):
        raise ConfigError(f"config {path} must be a string, got {value!r}.")
    return value


def to_tree(obj) -> Any:
    """A config dataclass as a JSON-able nested dict (choices as {"name", **settings})."""
    if isinstance(obj, Choice):
        return {"name": obj.name, **to_tree(obj.settings)}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_tree(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, (list, tuple)):
        return [to_tree(v) for v in obj]
    return obj


# ------------------------------------------------------------------------- overrides


def parse_text(hint, text: str, key: str = "value"):
    """A command-line ``text`` as the type ``hint`` asks for.

    bool: true/false/1/0/yes/no; int, float; str as is; ``tuple[X, ...]``: a Python
    literal ``(1, 2)`` / ``[1, 2]`` or ``1,2``; ``X | None``: ``None`` (or none, null) is
    None, anything else is parsed as X.
    """
    inner, optional = _unwrap_optional(hint)
    if optional:
        return None if text in NONE_SPELLINGS else parse_text(inner, text, key)
    origin = typing.get_origin(hint)
    try:
        if hint is bool:
            low = text.strip().lower()
            if low in _TRUE or low in _FALSE:
                return low in _TRUE
            raise ValueError(text)
        if hint is int:
            number = float(text)
            if not number.is_integer():
                raise ValueError(text)
            return int(number)
        if hint is float:
            return float(text)
        if hint is tuple or origin is tuple:
            stripped = text.strip()
            if stripped[:1] in "([":
                values = ast.literal_eval(stripped)
            else:
                values = [_literal_or_word(v.strip()) for v in stripped.split(",") if v.strip()]
            values = values if isinstance(values, (list, tuple)) else (values,)
            return _check_value(hint, list(values), key)
    except (ValueError, SyntaxError):
        kind = {bool: "true or false", int: "an integer", float: "a number"}.get(hint, "a list such as (1, 2)")
        raise ConfigError(f"config {key} must be {kind}, got {text!r}.") from None
    return text


def _literal_or_word(text: str):
    """A Python literal (``0.5``, ``'a'``), or the bare word itself (``empty_or_truncated``)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _walk(cls, tree: dict, parts: list[str], path: str, moved, root=None):
    """(hint, parent dict, name, choice class) of a dotted key, creating sections on the way.

    The choice class is set when the key is a choice's ``name`` (then hint is str)."""
    name, rest = parts[0], parts[1:]
    full = f"{path}{name}"
    fields, hints = _fields(cls), _hints(cls)
    if name not in fields:
        raise _unknown_key(path, name, list(fields), moved, root)
    hint, field_default = hints[name], _default(fields[name])
    if not rest:
        return hint, tree, name, None
    if _is_choice(hint):
        node = tree[name] = _choice_node(tree.get(name))
        if rest == ["name"]:
            return str, node, "name", hint
        choice_name = node.get("name", field_default.name)
        settings_cls = hint.REGISTRY[choice_name].settings
        if rest[0] not in _fields(settings_cls):
            raise _unknown_setting(hint, choice_name, rest[0], full, moved,
                                   f" Choose the {hint.REGISTRY.kind} first: {full}.name=...")
        return _walk(settings_cls, node, rest, f"{full}.", moved, root)
    section = _section_of(hint)
    if section is None:
        raise ConfigError(f"config key '{full}' is a value, not a section: '{full}.{'.'.join(rest)}' "
                          "does not exist.")
    node = tree.get(name)
    node = dict(node) if isinstance(node, Mapping) else {}
    tree[name] = node
    return _walk(section, node, rest, f"{full}.", moved, root)


def key_type(cls, tree: Mapping, key: str, *, moved=None):
    """The type hint of the dotted ``key`` in a tree of ``cls`` (a choice's settings by its name)."""
    return _walk(cls, _copy(tree), key.split("."), "", moved, cls)[0]


def _copy(tree: Mapping) -> dict:
    return {k: _copy(v) if isinstance(v, Mapping) else v for k, v in tree.items()}


def set_key(cls, tree: Mapping, key: str, text: str, *, moved=None) -> dict:
    """A copy of the (partial) tree of ``cls`` with the dotted ``key`` set from ``text``.

    * a value is parsed by its type (``parse_text``);
    * a choice by name: ``rl.estimator=loo`` or ``rl.estimator.name=loo`` (settings that the
      new entry does not have are dropped); its settings as ``rl.estimator.window=5``;
    * an optional section is switched on by setting any of its keys
      (``rl.anchor.weight=0.1``) or by ``rl.anchor=on`` (its defaults), off by ``rl.anchor=None``.

    Raises:
      ConfigError naming the key: unknown (with the closest valid key), moved, a section
      given a value, or a text that does not parse.
    """
    tree = _copy(tree)
    hint, parent, name, choice_of = _walk(cls, tree, key.split("."), "", moved, cls)
    section = _section_of(hint)
    optional = section is not None and not _is_section(hint)
    if choice_of is not None:  # key is a choice's name: parent is the choice's node
        switched = _choice_with_name(choice_of, parent, text)
        parent.clear()
        parent.update(switched)
    elif _is_choice(hint):
        parent[name] = _choice_with_name(hint, parent.get(name), text)
    elif section is not None:
        low = text.strip().lower()
        if optional and (text in NONE_SPELLINGS or low in _FALSE):
            parent[name] = None
        elif optional and (low in _TRUE or low == "{}"):
            node = parent.get(name)
            parent[name] = dict(node) if isinstance(node, Mapping) else {}
        else:
            example = next(iter(_fields(section)), "name")
            onoff = (f", switch it on with its defaults by '{key}=on' or off by '{key}=None'"
                     if optional else "")
            hint_text = moved(key) if moved else None
            raise ConfigError(f"config key '{key}' is a section; set one of its keys, e.g. "
                              f"'{key}.{example}=...'{onoff}" + (f" ({hint_text})." if hint_text else "."))
    else:
        parent[name] = parse_text(hint, text, key)
    return tree


def _choice_with_name(cls, node, name: str) -> dict:
    """The choice node switched to ``name``, keeping only the settings that entry has."""
    if name not in cls.REGISTRY:
        raise ConfigError(cls.REGISTRY.unknown(name))
    node = _choice_node(node)
    keep = _fields(cls.REGISTRY[name].settings)
    return {"name": name, **{k: v for k, v in node.items() if k in keep}}
