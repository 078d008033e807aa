"""Typed config trees: build, write back, dotted overrides, and errors that name the key."""

import copy
import dataclasses

import pytest

from jaxrl_vr.config_tree import Choice, ConfigError, dotted_keys, from_tree, parse_text, set_key, to_tree
from jaxrl_vr.registry import Entry, NoSettings, Registry


@dataclasses.dataclass(frozen=True)
class Window:
    size: int = 10

    def __post_init__(self):
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}.")


THINGS = Registry("thing", {"plain": lambda s, c: None, "windowed": Entry(lambda s, c: None, Window)})


class ThingChoice(Choice):
    REGISTRY = THINGS


@dataclasses.dataclass(frozen=True)
class Extra:
    weight: float = 0.5
    tags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Section:
    steps: int = 3
    rate: float = 0.1
    name: str | None = None
    flag: bool = False
    fractions: tuple[float, ...] = ()
    thing: ThingChoice = ThingChoice("plain")
    extra: Extra | None = None


@dataclasses.dataclass(frozen=True)
class Root:
    seed: int = 0
    section: Section = Section()


def test_absent_keys_keep_defaults_and_trees_round_trip():
    cfg = from_tree(Root, {"section": {"steps": 5, "thing": {"name": "windowed", "size": 4},
                                       "extra": {"tags": ["a", "b"]}, "fractions": [0.5]}})
    assert cfg.section.steps == 5 and cfg.section.rate == 0.1 and cfg.seed == 0
    assert cfg.section.thing == ThingChoice("windowed", Window(4))
    assert cfg.section.extra == Extra(tags=("a", "b")) and cfg.section.fractions == (0.5,)
    tree = to_tree(cfg)
    assert tree["section"]["thing"] == {"name": "windowed", "size": 4}
    assert tree["section"]["extra"] == {"weight": 0.5, "tags": ["a", "b"]}
    assert from_tree(Root, tree) == cfg
    assert from_tree(Root, {"section": {"thing": "windowed"}}).section.thing.settings == Window()
    assert from_tree(Root, None) == Root()


@pytest.mark.parametrize("tree, match", [
    ({"section": {"stepz": 1}}, r"unknown config key 'section\.stepz'; did you mean 'section\.steps'\?"),
    ({"steps": 1}, r"unknown config key 'steps'; did you mean 'section\.steps'\?"),  # right name, other section
    ({"section": {"steps": "3"}}, r"config section\.steps must be an integer, got '3'"),
    ({"section": {"steps": True}}, r"section\.steps must be an integer"),
    ({"section": {"steps": float("inf")}}, r"section\.steps must be an integer, got inf"),
    ({"section": {"flag": 1}}, r"section\.flag must be True or False"),
    ({"section": {"rate": "x"}}, r"section\.rate must be a number"),
    ({"section": {"fractions": 0.5}}, r"section\.fractions must be a list"),
    ({"section": {"thing": {"name": "windowd"}}}, r"unknown thing 'windowd' \(did you mean 'windowed'\?\)"),
    ({"section": {"thing": {"name": "plain", "size": 3}}}, r"thing 'plain' has no setting 'size'.*its settings: none"),
    ({"section": {"thing": {"name": "windowed", "size": 0}}}, r"config section\.thing\.size must be >= 1"),
    ({"section": {"extra": "on"}}, r"config section\.extra is a section: give a mapping"),
    ({"section": 3}, r"config section must be a mapping"),
])
def test_every_mistake_names_its_dotted_key(tree, match):
    with pytest.raises(ConfigError, match=match):
        from_tree(Root, tree)


def test_moved_keys_name_their_new_home():
    moved = {"section.old": "use section.steps"}.get
    with pytest.raises(ConfigError, match=r"config key 'section\.old' moved: use section\.steps"):
        from_tree(Root, {"section": {"old": 1}}, moved=moved)
    with pytest.raises(ConfigError, match=r"config key 'section\.old' moved"):
        set_key(Root, {}, "section.old", "1", moved=moved)


def test_set_key_parses_by_type_and_switches_choices_and_sections():
    tree = set_key(Root, {}, "section.steps", "7")
    tree = set_key(Root, tree, "section.rate", "1e-3")
    tree = set_key(Root, tree, "section.flag", "true")
    tree = set_key(Root, tree, "section.fractions", "0.25,0.5")
    tree = set_key(Root, tree, "section.name", "None")
    tree = set_key(Root, tree, "section.thing", "windowed")
    tree = set_key(Root, tree, "section.thing.size", "3")
    tree = set_key(Root, tree, "section.extra.tags", "a,b")
    cfg = from_tree(Root, tree)
    assert (cfg.section.steps, cfg.section.rate, cfg.section.flag) == (7, 1e-3, True)
    assert cfg.section.fractions == (0.25, 0.5) and cfg.section.name is None
    assert cfg.section.thing == ThingChoice("windowed", Window(3)) and cfg.section.extra.tags == ("a", "b")
    # Switching the entry drops the settings the new one does not have; None switches a section off.
    tree = set_key(Root, tree, "section.thing.name", "plain")
    tree = set_key(Root, tree, "section.extra", "None")
    cfg = from_tree(Root, tree)
    assert cfg.section.thing == ThingChoice("plain", NoSettings()) and cfg.section.extra is None
    assert from_tree(Root, set_key(Root, tree, "section.extra", "on")).section.extra == Extra()
    before = copy.deepcopy(tree)
    assert set_key(Root, tree, "seed", "2")["seed"] == 2 and tree == before  # the input is not modified


@pytest.mark.parametrize("key, text, match", [
    ("section.steps", "abc", r"section\.steps must be an integer, got 'abc'"),
    ("section.steps", "1.5", r"must be an integer"),
    ("section.steps", "inf", r"section\.steps must be an integer, got 'inf'"),
    ("section.flag", "maybe", r"must be true or false"),
    ("section.steps.x", "1", r"'section\.steps' is a value, not a section"),
    ("section", "1", r"'section' is a section; set one of its keys"),
    ("section.extra", "x", r"switch it on with its defaults by 'section\.extra=on'"),
    ("section.thing.size", "3", r"thing 'plain' has no setting 'size'.*section\.thing\.name=\.\.\."),
    ("section.thing", "nope", r"unknown thing 'nope'"),
])
def test_set_key_errors(key, text, match):
    with pytest.raises(ConfigError, match=match):
        set_key(Root, {}, key, text)


def test_parse_text_and_dotted_keys():
    assert parse_text(tuple[int, ...], "(1, 2)") == (1, 2)
    assert parse_text(tuple[float, ...], "[0.5]") == (0.5,)
    assert parse_text(int, "1e3") == 1000 and parse_text(str, "None") == "None"
    assert parse_text(str | None, "None") is None and parse_text(float | None, "2") == 2.0
    keys = dotted_keys(Root)
    assert {"seed", "section.steps", "section.thing.name", "section.extra.weight"} <= set(keys)
