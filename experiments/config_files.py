"""Config files and command-line overrides → a validated ``PipelineConfig``.

A config file is a Python file with ``get_config(variant) -> ConfigDict`` (or dict) that
states only what it changes from the defaults of ``jaxrl_vr.train.config``; it may import
modules that register estimators, strategies or methods. Overrides are dotted keys with
values as text (``rl.estimator.name=loo``), parsed by each key's type
(``jaxrl_vr.config_tree.set_key``). Every mistake is a ``ConfigError`` naming the key and
the fix: an unknown key (with the closest one), a key of the flat layout before the config
sections (with its new home), a value that does not parse.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Sequence

from jaxrl_vr.config_tree import Choice, ConfigError, key_type, set_key
from jaxrl_vr.train.config import PipelineConfig, moved_key

__all__ = ["ConfigError", "apply_overrides", "build_config", "load_config_file", "split_override"]


def load_config_file(spec: str) -> dict:
    """The tree of ``path[:variant]``'s ``get_config(variant)`` (what it changes)."""
    path, _, variant = spec.partition(":")
    if not path:
        raise ConfigError("--config needs a file, e.g. --config=experiments/configs/default.py[:variant].")
    if not os.path.isfile(path):
        what = "is a directory, not a config file" if os.path.isdir(path) else "does not exist"
        raise ConfigError(f"config file {path} {what} (from --config={spec}; relative to {os.getcwd()}).")
    name = "_jaxrl_vr_config_" + os.path.splitext(os.path.basename(path))[0]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as err:
        raise ConfigError(f"config file {path} line {err.lineno}: {err.msg}.") from None
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path} has no get_config(variant) function.")
    try:
        config = module.get_config(variant or None)
    except ValueError as err:  # e.g. an unknown variant
        raise ConfigError(f"config file {path}: {err}") from None
    tree = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return tree


def split_override(text: str) -> tuple[str, str]:
    """``"rl.steps=10"`` (with or without ``--config.``) -> ("rl.steps", "10")."""
    key, sep, value = text.removeprefix("--").removeprefix("config.").partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not key=value (e.g. rl.steps=10).")
    return key, value


def _sets_a_choice(tree: dict, key: str) -> bool:
    """Whether ``key`` chooses a registry entry (applied before that entry's settings)."""
    if key.endswith(".name"):
        return True
    try:
        hint = key_type(PipelineConfig, tree, key, moved=moved_key)
    except ConfigError:
        return False
    return isinstance(hint, type) and issubclass(hint, Choice)


def apply_overrides(tree: dict, overrides: Sequence[tuple[str, str]]) -> dict:
    """The tree with each (dotted key, text) set; choices of a registry entry first, so
    ``rl.estimator.window=5 rl.estimator.name=curverl`` works in either order."""
    ordered = sorted(overrides, key=lambda kv: not _sets_a_choice(tree, kv[0]))
    for key, text in ordered:
        tree = set_key(PipelineConfig, tree, key, text, moved=moved_key)
    return tree


def build_config(spec: str, overrides: Sequence[tuple[str, str]] = ()) -> PipelineConfig:
    """The PipelineConfig of a config file and its overrides (raises ConfigError)."""
    return PipelineConfig.from_dict(apply_overrides(load_config_file(spec), overrides))
