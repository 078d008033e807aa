"""HumanEval's reference solutions through the sandbox and the test harness: all must score 1.0.

    python -m experiments.check_humaneval                      # all 164, the three forms
    python -m experiments.check_humaneval --num=20 --forms=body

Each canonical solution is scored by the "humaneval" verifier in a VerifierPool (the same
path training and evaluation take) as the body continuing the prompt ("body"), as the
full function in a fenced block ("fenced") and as prose + the full function ("function").
Prints, per form, the problems that scored 1.0, the tests passed out of those run, and every
problem that failed (with its per-test flags); exits 1 if any failed.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app, flags

from jaxrl_vr.tasks.humaneval import make_humaneval_items, reference_completion
from jaxrl_vr.verifiers.pool import VerifierPool

FORMS = {
    "body": lambda item: reference_completion(item),
    "fenced": lambda item: ("Here is the solution:\n```python\n" + item.meta["code_prompt"]
                            + reference_completion(item) + "```\nIt loops over the input."),
    "function": lambda item: ("Sure.\n\n" + item.meta["code_prompt"] + reference_completion(item)
                              + "\n\nThis function returns the answer.\n"),
}


def define_flags() -> None:
    flags.DEFINE_integer("num", 0, "Check the first NUM problems (0 = all 164).")
    flags.DEFINE_list("forms", list(FORMS), f"Completion forms to check, of {list(FORMS)}.")
    flags.DEFINE_integer("workers", os.cpu_count() or 2, "Verifier pool workers.")


def main(argv) -> int:
    del argv
    unknown = sorted(set(flags.FLAGS.forms) - set(FORMS))
    if unknown:
        raise app.UsageError(f"unknown forms {unknown}; choose from {list(FORMS)}.")
    items = make_humaneval_items()
    if flags.FLAGS.num:
        items = items[: flags.FLAGS.num]
    failed = 0
    with VerifierPool(flags.FLAGS.workers, timeout_s=30.0) as pool:
        for form in flags.FLAGS.forms:
            start = time.perf_counter()
            result = pool.score(items, [FORMS[form](item) for item in items])
            passed, total = result.test_counts()
            solved = int((result.scores == 1.0).sum())
            print(f"[{form}] {solved}/{len(items)} reference solutions score 1.0; tests passed "
                  f"{int(passed.sum())}/{int(total.sum())}; {time.perf_counter() - start:.1f} s")
            for item, score, status, error, flags_ in zip(items, result.scores, result.statuses, result.errors,
                                                          result.test_passed):
                if score != 1.0:
                    failed += 1
                    print(f"  FAILED {item.meta['task_id']}: {status} {error or ''} tests={flags_}")
    return 1 if failed else 0


if __name__ == "__main__":
    define_flags()
    app.run(lambda argv: sys.exit(main(argv)))
