"""Reading optimized HLO text in tests: what the compiled program computes."""

import collections
import re


def dot_output_shapes(hlo_text: str) -> collections.Counter:
    """Output shape of every dot in an optimized HLO module's text (fused or not), as
    "f32[24,16]", counted."""
    return collections.Counter(re.findall(r"= (\w+\[[\d,]*\])(?:\{[^}]*\})? dot\(", hlo_text))
