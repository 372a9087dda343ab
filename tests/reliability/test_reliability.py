"""Every bad input of tests/reliability/cases.py is refused in one clear line, and
docs/reliability.md is the table they make now."""

from __future__ import annotations

import re

import pytest

from tests.reliability.cases import CASES
from tests.reliability.run import DOC, Outcome, command_text, run_all, table


@pytest.fixture(scope="module")
def outcomes() -> list[Outcome]:
    return run_all()


def _param(i: int) -> object:
    case = CASES[i]
    name = f"{i + 1}-" + re.sub(r"[^\w]+", "-", case.kind).strip("-")
    marks = [pytest.mark.xfail(reason=case.known, strict=True)] if case.known else []
    return pytest.param(i, id=name, marks=marks)


@pytest.mark.parametrize("index", [_param(i) for i in range(len(CASES))])
def test_refused_in_one_line(outcomes: list[Outcome], index: int) -> None:
    o = outcomes[index]
    assert not o.problems(), (f"rackplan {command_text(o.case)}: {'; '.join(o.problems())}\n"
                              f"stderr: {o.stderr[-2000:]}")


def test_at_least_the_reported_cases() -> None:
    assert len(CASES) >= 122


def test_doc_is_the_table(outcomes: list[Outcome]) -> None:
    assert DOC.read_text(encoding="utf-8") == table(outcomes), (
        f"{DOC.name} is out of date: python -m tests.reliability.run --write")
