"""Verifier registry and the built-in "exact" verifier."""

import pytest

from jaxrl_vr.tasks.base import TaskItem
from jaxrl_vr.verifiers import registry


def _item(answer="85"):
    return TaskItem(uid="u", prompt="47+38=", answer=answer)


@pytest.mark.parametrize("completion, expected", [
    ("85", (1.0, "ok")),
    (" 8 5", (1.0, "ok")),          # spaces stripped
    ("85=", (1.0, "ok")),           # leading integer only
    ("+85", (1.0, "ok")),
    ("86", (0.0, "wrong")),
    ("851", (0.0, "wrong")),
    ("-85", (0.0, "wrong")),
    ("", (0.0, "unparsable")),
    ("=85", (0.0, "unparsable")),
    ("x" * 100_000, (0.0, "unparsable")),
    ("9" * 100_000, (0.0, "wrong")),  # longer than int()'s digit limit: still just wrong
])
def test_exact_verifier(completion, expected):
    assert registry.exact_verifier(_item(), completion) == expected


def test_exact_verifier_rejects_non_integer_gold():
    with pytest.raises(ValueError, match="integer answer"):
        registry.exact_verifier(_item(answer="abc"), "1")


def test_register_and_get():
    def always_half(item, completion):
        return 0.5

    registry.register_verifier("test_half", always_half, overwrite=True)
    assert registry.get_verifier("test_half") is always_half
    with pytest.raises(ValueError, match="already registered"):
        registry.register_verifier("test_half", lambda i, c: 1.0)
    with pytest.raises(ValueError, match="Unknown verifier 'nope'"):
        registry.get_verifier("nope")
    registry.register_verifier("test_path", "jaxrl_vr.verifiers.registry:exact_verifier", overwrite=True)
    assert registry.get_verifier("test_path") is registry.exact_verifier
    registry.register_verifier("test_bad_path", "jaxrl_vr.verifiers.registry:missing", overwrite=True)
    with pytest.raises(ValueError, match="cannot import"):
        registry.get_verifier("test_bad_path")
    assert {"exact", "math", "code"} <= set(registry.registered_verifiers())


@pytest.mark.parametrize("output, expected", [
    (1, (1.0, "ok")), (0.0, (0.0, "wrong")), (True, (1.0, "ok")), ((0.0, "unparsable"), (0.0, "unparsable")),
    ((0.25, "ok"), (0.25, "ok")),
])
def test_normalize_output(output, expected):
    assert registry.normalize_output(output) == expected


@pytest.mark.parametrize("output", [float("nan"), float("inf"), "1", (1.0, "great"), (1.0, "ok", 2), None,
                                    (1.0, "ok", "TF"), (1.0, "ok", (True, 1)), (1.0, "ok", (), 4)])
def test_normalize_output_rejects(output):
    with pytest.raises((TypeError, ValueError)):
        registry.normalize_verdict(output)


@pytest.mark.parametrize("output, expected", [
    ((0.0, "wrong", [True, False]), registry.Verdict(0.0, "wrong", (True, False))),
    (registry.Verdict(1, "ok", (True,)), registry.Verdict(1.0, "ok", (True,))),
    ((1.0, "ok", None), registry.Verdict(1.0, "ok", None)),
    (0.5, registry.Verdict(0.5, "ok", None)),
])
def test_normalize_verdict_keeps_per_test_results(output, expected):
    assert registry.normalize_verdict(output) == expected
    assert registry.normalize_output(output) == expected[:2]


def test_check_verifier_names_the_registered_ones_and_the_fix():
    registry.check_verifier("exact")  # built-in: fine
    registry.check_verifier("math")
    with pytest.raises(ValueError) as info:
        registry.check_verifier("maths")
    message = str(info.value)
    assert "Unknown verifier 'maths'" in message and "did you mean 'math'?" in message
    for name in ("exact", "math", "code"):
        assert repr(name) in message
    assert "register_verifier('maths', fn)" in message and "'my_pkg.my_module:my_fn'" in message
    with pytest.raises(ValueError, match="Unknown verifier 'zzz'; registered"):  # nothing close: no hint
        registry.check_verifier("zzz")
    with pytest.raises(ValueError, match="Unknown verifier None"):
        registry.check_verifier(None)


def test_check_verifier_resolve_imports_the_path():
    registry.register_verifier("test_check_bad_path", "no_such_module_xyz:fn", overwrite=True)
    registry.check_verifier("test_check_bad_path")  # registered: enough without resolve
    with pytest.raises(ValueError, match="cannot import 'no_such_module_xyz:fn'"):
        registry.check_verifier("test_check_bad_path", resolve=True)
    registry.check_verifier("exact", resolve=True)
