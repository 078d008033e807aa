"""Tools: plain callables with a schema, one registry line each.

A tool is a function of keyword arguments returning text; it fails by raising (the
environment turns the exception into an error observation: the model reads it, the run
goes on). A code tool takes one argument, ``code``, which the model writes as the body of
its call. Adding a tool::

    def word_count(text: str) -> str:
        return str(len(text.split()))

    TOOLS["word_count"] = Entry(lambda settings: Tool("word_count", word_count,
        "Counts the words of a text.", {"text": {"type": "string"}}))

and selecting it with ``task.tools=python,word_count``.
"""

from __future__ import annotations

import ast
import atexit
import concurrent.futures
import dataclasses
import multiprocessing
import threading
from typing import Any, Callable, Mapping

from jaxrl_vr.registry import Entry, Registry
from jaxrl_vr.verifiers import sandbox

__all__ = ["PythonSettings", "TOOLS", "Tool", "ToolError", "make_tool", "python_program", "python_tool"]


class ToolError(RuntimeError):
    """A tool call that ran and failed; the message is what the model reads."""


@dataclasses.dataclass(frozen=True)
class Tool:
    """A callable the model can call.

    Attributes:
      name: how the model names it.
      fn: ``fn(**arguments) -> str``; raises on failure (``ToolError`` for a message meant
        for the model).
      description: one line for the model (a system prompt may list the tools).
      parameters: JSON-schema properties of the arguments ({name: {"type": ...}}).
      code: the tool takes the call's body as its one argument ``code`` (no JSON).
    """

    name: str
    fn: Callable[..., str]
    description: str
    parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    code: bool = False

    def schema(self) -> dict:
        """The OpenAI-style function schema of the tool."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": dict(self.parameters),
                           "required": sorted(self.parameters)}}}


@dataclasses.dataclass(frozen=True)
class PythonSettings:
    """``task.tools=python``: the sandbox's limits for one call.

    Attributes:
      timeout_s: wall-clock limit of a call.
      memory_mb: address-space limit.
      max_output_chars: the output is cut to its last this-many characters.
    """

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_output_chars: int = 2000


def python_program(code: str) -> str:
    """``code`` as a notebook cell: when its last statement is an expression, its value is
    printed (unless None). Unparsable code is returned as it is (the sandbox reports it)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    last = tree.body[-1]
    shown = ast.parse("__value = None\nif __value is not None: print(__value)").body
    shown[0].value = last.value
    tree.body[-1:] = shown
    return ast.unparse(ast.fix_missing_locations(tree))


_POOL: concurrent.futures.ProcessPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _sandbox_pool() -> concurrent.futures.ProcessPoolExecutor:
    """Worker processes (spawned, so no JAX threads) that start the sandbox's subprocesses:
    forking the trainer itself, which runs JAX's threads, could deadlock."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ProcessPoolExecutor(max_workers=4, mp_context=multiprocessing.get_context("spawn"))
            atexit.register(_POOL.shutdown, wait=False, cancel_futures=True)
        return _POOL


def _run_sandboxed(program: str, timeout_s: float, memory_mb: int) -> sandbox.CodeResult:
    global _POOL
    try:
        future = _sandbox_pool().submit(sandbox.run_python, program, [], timeout_s=timeout_s, memory_mb=memory_mb)
        return future.result(timeout=timeout_s + 60.0)
    except concurrent.futures.process.BrokenProcessPool:
        with _POOL_LOCK:
            _POOL = None  # the next call starts fresh workers
        raise ToolError("the sandbox's worker died; try again") from None


def python_tool(settings: PythonSettings = PythonSettings()) -> Tool:
    """Runs the model's code in the verifier sandbox (time and memory limits, no network,
    no files outside its own directory); returns stdout, or raises with the error's last
    line (and the exit status) for the model to read."""

    def run(code: str) -> str:
        result = _run_sandboxed(python_program(code), settings.timeout_s, settings.memory_mb)
        out = result.stdout[-settings.max_output_chars:]
        if result.status == "timeout":
            raise ToolError(f"{out}timed out after {settings.timeout_s:g} s".lstrip())
        if result.status == "unparsable" or result.program_error or result.status == "error":
            lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
            reason = lines[-1] if lines else (result.program_error or result.status)
            raise ToolError(f"{out}{reason[-settings.max_output_chars:]}".strip())
        return out.rstrip("\n")

    return Tool("python", run, "Runs Python code and returns what it prints (a last expression is printed).",
                {"code": {"type": "string"}}, code=True)


TOOLS = Registry("tool", {"python": Entry(python_tool, PythonSettings)})


def make_tool(name: str, settings: Any = None) -> Tool:
    """The registered tool `name` (unknown names fail with "did you mean")."""
    entry = TOOLS[name]
    return entry.fn(entry.settings() if settings is None else settings)
