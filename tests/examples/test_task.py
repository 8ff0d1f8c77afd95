from __future__ import annotations

import pytest

from examples.task import (
    TEMPLATES,
    TOKEN_BUDGET,
    CalcError,
    calculate,
    first_messages,
    grade,
    make_problems,
    parse_action,
    parse_number,
    problem_split,
)


def test_problems_are_deterministic_and_distinct() -> None:
    a, b = make_problems("train", 40, seed=3), make_problems("train", 40, seed=3)
    assert a == b
    assert len({p.id for p in a}) == 40
    assert make_problems("train", 40, seed=4) != a


def test_heldout_and_training_never_share_a_problem() -> None:
    held = {p.id for p in make_problems("heldout", 60)}
    train = {p.id for seed in range(5) for p in make_problems("train", 60, seed=seed)}
    assert not held & train
    for p in make_problems("heldout", 60):
        _, a, b = p.id.rsplit("-", 2)
        assert problem_split(p.template, int(a), int(b)) == "heldout"


def test_answers_follow_the_template_operation() -> None:
    ops = {t.id: t.op for t in TEMPLATES}
    for p in make_problems("train", 200):
        _, a, b = p.id.rsplit("-", 2)
        assert p.answer == int(calculate(f"{a}{ops[p.template]}{b}")), p
        assert p.answer > 0
    assert {p.template for p in make_problems("train", 200)} == set(ops)


def test_first_messages_show_the_protocol_once_then_ask() -> None:
    p = make_problems("heldout", 1)[0]
    msgs = first_messages(p)
    assert msgs[0]["role"] == "system" and "CALC:" in msgs[0]["content"]
    assert msgs[-1] == {"role": "user", "content": p.question}
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]


@pytest.mark.parametrize(
    ("text", "kind", "argument"),
    [
        ("CALC: 28*22", "calc", "28*22"),
        ("CALC: 28*22 = 564 pencils\nANSWER: 564", "calc", "28*22"),  # the first action wins
        ("Sure. ANSWER: 1,767.", "answer", "1,767."),
        ("ANSWER: 616\nCALC: 1+1", "answer", "616"),
        ("The answer is 616.", "none", ""),
        ("", "none", ""),
    ],
)
def test_parse_action(text: str, kind: str, argument: str) -> None:
    action = parse_action(text)
    assert (action.kind, action.argument) == (kind, argument)


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("28*22", "616"),
        ("476 / 17", "28"),
        ("7/2", "3.5"),
        ("12 x 3", "36"),
        ("(3+4)*-2", "-14"),
        ("1,200 - 1", "1199"),
    ],
)
def test_calculator(expr: str, value: str) -> None:
    assert calculate(expr) == value


@pytest.mark.parametrize("expr", ["__import__('os')", "2**10", "9" * 90, "1/0", "a+1", "", "99999999*99999999"])
def test_calculator_refuses_anything_but_arithmetic(expr: str) -> None:
    with pytest.raises(CalcError):
        calculate(expr)


def test_parse_number() -> None:
    assert parse_number("1,767.") == 1767.0
    assert parse_number("-3.5 km") == -3.5
    assert parse_number("none") is None


def test_grade_is_correct_times_brevity() -> None:
    p = make_problems("heldout", 1)[0]
    assert grade(p, str(p.answer), TOKEN_BUDGET).reward == 1.0
    assert grade(p, f"{p.answer}.", 2 * TOKEN_BUDGET).reward == 0.5
    wrong = grade(p, str(p.answer + 1), 10)
    assert (wrong.reward, wrong.correct) == (0.0, False)
    assert grade(p, None, 10).reward == 0.0


@pytest.mark.parametrize("constant", ["0", "1", "42", "100", "1000"])
def test_a_constant_answer_scores_near_zero_on_the_heldout_set(constant: str) -> None:
    held = make_problems("heldout", 64)
    mean = sum(grade(p, constant, 8).reward for p in held) / len(held)
    assert mean < 0.05
