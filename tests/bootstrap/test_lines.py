"""bootstrap/lines.py: the one one_line, and reasons cut at a word.

.venv/bin/python -m pytest tests/bootstrap/test_lines.py
"""

import pytest

from bootstrap import lines


@pytest.mark.parametrize("length", [499, 500, 501, 5000])
def test_reasons_are_cut_at_a_word_keeping_the_start(length):
    text = ("first error line " * 400)[:length]
    trimmed = lines.trim_reason(text)
    assert len(trimmed) <= lines.REASON_LIMIT and trimmed.startswith("first error line")
    if length > lines.REASON_LIMIT:
        assert trimmed.endswith(" ...") and trimmed[:-4].split(" ")[-1] in {
            "first",
            "error",
            "line",
        }


def test_one_line_joins_the_lines_and_cuts_only_when_told():
    error = RuntimeError("s5cmd cp failed:\n  caused by: " + "refused " * 100)
    whole = lines.one_line(error)
    assert whole.startswith("RuntimeError: s5cmd cp failed: caused by: refused")
    assert "\n" not in whole and len(whole) > lines.REASON_LIMIT
    assert lines.one_line(error, lines.REASON_LIMIT) == lines.trim_reason(whole)
