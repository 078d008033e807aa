"""Imported by the VerifierPool forkserver only: loads and warms the built-in verifiers once.

Every worker forks from the warmed server, so math-verify's LaTeX grammar and regexes are
ready before the first item's deadline starts.
"""

from jaxrl_vr.verifiers import math_answers

math_answers.warmup()
