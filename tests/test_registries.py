"""Registries: one "did you mean", settings dataclasses, mapping behaviour."""

import dataclasses

import pytest

from jaxrl_vr.registry import Entry, NoSettings, Registry, UnknownNameError, closest, did_you_mean


@dataclasses.dataclass(frozen=True)
class Knob:
    turns: int = 1


def test_registry_maps_names_to_entries_with_settings():
    reg = Registry("widget", {"a": lambda s, c: "a", "b": Entry(lambda s, c: s.turns, Knob)})
    assert list(reg) == ["a", "b"] and len(reg) == 2 and "a" in reg and "z" not in reg
    assert reg["a"].settings is NoSettings and reg.settings("b", {"turns": 3}) == Knob(3)
    reg["c"] = lambda s, c: "c"  # one registry line
    assert reg["c"].fn(None, None) == "c"
    assert reg.get("zz") is None  # Mapping semantics: a missing name is a KeyError too
    with pytest.raises(UnknownNameError, match=r"unknown widget 'bb' \(did you mean 'b'\?\); registered: a, b, c\."):
        reg["bb"]
    with pytest.raises(ValueError):  # also a ValueError, for callers that catch config errors
        reg["bb"]
    with pytest.raises(TypeError, match="dataclass"):
        reg["d"] = Entry(lambda s, c: None, dict)


def test_did_you_mean_is_one_helper():
    assert did_you_mean("grpoo", ["grpo", "loo"]) == " (did you mean 'grpo'?)"
    assert did_you_mean("xyz", ["grpo"]) == ""
    assert closest("advantag", ["advantage", "steps"]) == "advantage"
