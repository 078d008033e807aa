"""Dataset adapters: JSONL / Parquet rows into TaskItems, and prompt templates.

Rows are {prompt, answer} (GSM8K / MATH style; verifier "math" by default) or
{prompt, tests} (code; verifier "code"). Optional keys: "id" (else a hash of the prompt),
"verifier", "difficulty", "timeout_s". A GSM8K answer ("... #### 72") keeps only the text
after the last "####". A malformed row is reported with its line number (1-based; the
row index for Parquet) and skipped (on_error="skip", the default) or rejected
(on_error="raise", a ValueError before any item is returned).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from jaxrl_vr.tasks.base import TaskItem, in_split, stable_hash

__all__ = ["LoadedTasks", "load_task_file", "row_to_item", "render_prompt"]

logger = logging.getLogger(__name__)


class LoadedTasks(NamedTuple):
    """Items that loaded, and one message per skipped row ("path:line: problem")."""

    items: list[TaskItem]
    problems: list[str]


def row_to_item(row: Any, *, source: str = "data", prompt_key: str = "prompt", answer_key: str = "answer",
                tests_key: str = "tests") -> TaskItem:
    """One row as a TaskItem; raises ValueError naming the problem when the row is malformed."""
    if not isinstance(row, dict):
        raise ValueError(f"a row must be a JSON object, got {type(row).__name__}")
    prompt = row.get(prompt_key)
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"missing or empty {prompt_key!r} string")
    answer, tests = row.get(answer_key), row.get(tests_key)
    if answer is None and tests is None:
        raise ValueError(f"needs an {answer_key!r} or a {tests_key!r} field")
    if answer is not None:
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise ValueError(f"{answer_key!r} must be a string or a number, got {type(answer).__name__}")
        answer = str(answer)
        if "####" in answer:
            answer = answer.rsplit("####", 1)[1]
        answer = answer.strip()
        if not answer:
            raise ValueError(f"empty {answer_key!r}")
    if tests is not None:
        if isinstance(tests, str) or not isinstance(tests, Sequence) or not tests or not all(
                isinstance(t, str) for t in tests):
            raise ValueError(f"{tests_key!r} must be a non-empty list of strings")
        tests = tuple(tests)
    verifier = row.get("verifier", "code" if tests is not None and answer is None else "math")
    meta = {"source": source}
    if "timeout_s" in row:
        meta["timeout_s"] = float(row["timeout_s"])
    uid = str(row["id"]) if row.get("id") is not None else f"{source}:{stable_hash(prompt):016x}"
    return TaskItem(uid=uid, prompt=prompt, answer=answer, tests=tests, verifier=str(verifier),
                    difficulty=int(row.get("difficulty", 0)), meta=meta)


def _rows(path: str):
    """(line number, row or the parse error) pairs."""
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq  # noqa: PLC0415
        except ImportError as e:
            raise ImportError(f"Reading {path} needs pyarrow: pip install pyarrow.") from e
        for index, row in enumerate(pq.read_table(path).to_pylist()):
            yield index, row
        return
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as e:
                yield number, ValueError(f"invalid JSON ({e.msg})")


def load_task_file(path: str, *, on_error: str = "skip", split: str | None = None, heldout_fraction: float = 0.0,
                   **keys: str) -> LoadedTasks:
    """Loads a .jsonl or .parquet file of task rows.

    Args:
      path: the file (".parquet", anything else is read as JSON lines).
      on_error: "skip" (log and drop malformed rows) or "raise".
      split: "train" / "test" / None: keep rows whose prompt hashes into that split.
      heldout_fraction: share of prompts in "test".
      **keys: prompt_key / answer_key / tests_key to rename the fields.

    Returns:
      LoadedTasks(items, problems).

    Raises:
      FileNotFoundError: ``path`` does not exist.
      ValueError: ``path`` is a directory, or two rows share an id (or, without ids, a
        prompt), naming both lines.
    """
    if on_error not in ("skip", "raise"):
        raise ValueError(f"on_error must be 'skip' or 'raise', got {on_error!r}.")
    if not os.path.exists(path):
        raise FileNotFoundError(f"Task file {path} does not exist.")
    if os.path.isdir(path):
        raise ValueError(f"Task file {path} is a directory; give a .jsonl or .parquet file.")
    source = os.path.splitext(os.path.basename(path))[0]
    items, problems, first_line = [], [], {}
    for number, row in _rows(path):
        try:
            if isinstance(row, Exception):
                raise row
            item = row_to_item(row, source=source, **keys)
        except (ValueError, TypeError) as e:
            where = "row" if path.endswith(".parquet") else "line"
            message = f"{path}:{where} {number}: {e}"
            if on_error == "raise":
                raise ValueError(f"Malformed task {message}. Fix the row or pass on_error='skip'.") from None
            logger.warning("Skipping malformed task %s", message)
            problems.append(message)
            continue
        where = "row" if path.endswith(".parquet") else "line"
        if item.uid in first_line:  # the tracker and the caches key prompts by uid
            what = "id" if row.get("id") is not None else "prompt"
            raise ValueError(f"{path}:{where} {number} repeats the {what} of {where} "
                             f"{first_line[item.uid]}; remove the duplicate rows (each prompt once).")
        first_line[item.uid] = number
        if in_split(item.prompt, split, heldout_fraction=heldout_fraction):
            items.append(item)
    return LoadedTasks(items, problems)


def render_prompt(item: TaskItem, tokenizer=None, *, template: str = "{prompt}", chat: bool = False,
                  system: str | None = None) -> str:
    """The text fed to the model for `item`.

    Plain: `template.format(prompt=item.prompt)` (e.g. "{prompt}" for the arithmetic task,
    "Question: {prompt}\\nAnswer:" for a base model). Chat: the formatted prompt as the
    user message (after an optional system message) through the tokenizer's
    `apply_chat_template(messages, add_generation_prompt=True)`.
    """
    text = template.format(prompt=item.prompt)
    if not chat:
        return text
    if tokenizer is None:
        raise ValueError("chat=True needs a tokenizer with apply_chat_template.")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)
