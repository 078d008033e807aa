"""benchmarks/decode_attention.py runs both forms and reports the rule's pick (no timings checked)."""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import decode_attention  # noqa: E402


def test_kernel_reports_both_forms_and_the_rule():
    report = decode_attention.kernel(argparse.Namespace(grid="2x8,2x520", repeats=1))
    cells = {(c["rows"], c["slots"]): c for c in report["cells"]}
    assert [cells[k]["rule_picks"] for k in ((2, 8), (2, 520))] == ["one_token", "dots"]
    for cell in cells.values():
        assert cell["dots_ms"] > 0 and cell["one_token_ms"] > 0
        assert cell["one_token_over_dots"] == cell["one_token_ms"] / cell["dots_ms"]
