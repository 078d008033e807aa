"""What the command-line entry points share: exit statuses, ``-h``/``--help``, interrupts.

``python -m experiments.train|evaluate|compare`` print their docstring and flags for
``-h`` or ``--help`` and exit 0 (absl alone knows only ``--help`` and exits 1 after it);
a flag mistake is one ``error:`` line and exit 2; SIGINT or SIGTERM outside the code that
handles them itself is one ``stopped:`` line and exit 130, never a traceback.
"""

from __future__ import annotations

import signal
import sys
from typing import Callable, NoReturn

from absl import flags

USAGE_ERROR = 2  # exit status for a user's mistake
INTERRUPTED = 130  # exit status after SIGINT / SIGTERM

HELP_FLAGS = ("-h", "--help", "-help", "--helpshort", "--helpfull")


def fail(message: str) -> NoReturn:
    """Prints ``error: <message>`` (one line) to stderr and exits with status 2."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    sys.exit(USAGE_ERROR)


def _stop(signum, frame) -> NoReturn:
    name = signal.Signals(signum).name
    print(f"stopped: interrupted by {name}; re-run the same command to continue (finished work "
          "is kept in the workdir).", file=sys.stderr, flush=True)
    raise SystemExit(INTERRUPTED)


def exit_on_interrupt() -> None:
    """SIGINT and SIGTERM end the process with one line and status 130 (a handler of their
    own, such as the RL loop's, takes over while it runs). A signal the process was
    started ignoring (``nohup``, ``&`` in a script) stays ignored."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) in (signal.default_int_handler, signal.SIG_DFL):
            signal.signal(signum, _stop)


def print_help_if_asked(argv: list[str], doc: str | None) -> None:
    """For ``-h`` / ``--help``: the docstring and the main module's flags on stdout, exit 0."""
    if not any(arg in HELP_FLAGS for arg in argv[1:]):
        return
    own = flags.FLAGS.flags_by_module_dict().get(sys.argv[0], [])
    print((doc or "").strip() + ("\n\nflags:" if own else ""))
    for flag in sorted(own, key=lambda f: f.name):
        default = "" if flag.default in (None, "", []) else f" (default: {flag.default!r})"
        print(f"  --{flag.name}: {flag.help}{default}")
    sys.exit(0)


def flags_parser(doc: str | None) -> Callable[[list[str]], list[str]]:
    """An ``app.run`` flags parser: help as above, one-line errors (exit 2) for bad flags."""
    def parse(argv: list[str]) -> list[str]:
        print_help_if_asked(argv, doc)
        try:
            return flags.FLAGS(argv)
        except flags.Error as err:
            fail(str(err))
    return parse
