"""One prompt normaliser, and cleaning a training pool against its held-out set."""

from jaxrl_vr.tasks.base import SplitReport, TaskItem, clean_split, drop_repeats, normalize_prompt


def _items(*prompts):
    return [TaskItem(uid=f"u{i}", prompt=p, answer="1") for i, p in enumerate(prompts)]


def test_normalize_prompt_collapses_whitespace_strips_and_casefolds():
    assert normalize_prompt("  What is\t2 +  2?\n") == "what is 2 + 2?"
    assert normalize_prompt("STRASSE") == normalize_prompt("straße")  # case-folded, not only lowered
    assert normalize_prompt("2+2") != normalize_prompt("2 + 2")  # spaces inside a word are kept apart


def test_drop_repeats_keeps_the_first_and_counts_an_excluded_repeat_once():
    kept, repeats, excluded = drop_repeats(_items("a b", "A  b", "c", "c ", "d"), exclude={"d", "c"})
    assert [it.uid for it in kept] == ["u0"] and (repeats, excluded) == (1, 3)


def test_clean_split_removes_repeats_and_held_out_prompts_then_caps():
    train = _items("1+1", "2+2", " 1+1", "3+3", "HELD", "4+4", "5+5")
    heldout = [TaskItem(uid=f"h{i}", prompt=p, answer="1") for i, p in enumerate(["held", "Held ", "other", "x"])]
    pool, evaluated, report = clean_split(train, heldout, num_train=3, num_eval=2)
    assert [it.prompt for it in evaluated] == ["held", "other"]  # the repeat left before the cap
    assert [it.prompt for it in pool] == ["1+1", "2+2", "3+3"]  # later rows replace the removed ones
    assert report == SplitReport(train=3, heldout=2, train_duplicates=1, train_in_heldout=1,
                                 heldout_duplicates=1)
    again = clean_split(pool, evaluated)[2]
    total = report.plus(again)
    assert total.train_duplicates == 1 and total.train == 3
    assert "1 repeated and 1 held-out prompts" in report.describe()
    short = SplitReport(train=5, heldout=2, extra_drawn=9, train_short=3).describe()
    assert "drew 9 more" in short and "3 training and 0 held-out prompts short" in short
