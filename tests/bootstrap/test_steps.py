"""bootstrap/steps.py: a step's error becomes one failure line.

.venv/bin/python -m pytest tests/bootstrap/test_steps.py
"""

import pytest

from bootstrap.steps import StepFailed, step


def test_multi_line_errors_become_one_failure_line():
    def s5cmd_fails():
        raise RuntimeError("s5cmd cp failed: ERROR session\ncaused by: dial tcp: refused")

    with pytest.raises(StepFailed) as failure:
        step("data pull", s5cmd_fails)
    assert failure.value.reason == (
        "RuntimeError: s5cmd cp failed: ERROR session caused by: dial tcp: refused"
    )
