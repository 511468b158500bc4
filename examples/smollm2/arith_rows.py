"""One-step arithmetic questions in real data-set formats: the easy tasks SmolLM2 is trained on.

The examples' rows give SmolLM2-135M a reward of 0 in every kind (docs/TRAINING.md). One
addition, subtraction or multiplication of one-digit numbers is easier, and comes in two
published shapes, each graded by the service's own kind: a GSM8K row (`question`, `answer` =
worked solution ending in "#### N") as a `math` task with `format: gsm8k`, or a multiple-choice
row (`question`, `choices`, `answer` = letter, as ARC and MMLU publish) as a `stem` task.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

_TEMPLATES: list[tuple[str, str, Callable[[int, int], int]]] = [
    ("What is {a} + {b}?", "{a} + {b} = {r}", lambda a, b: a + b),
    ("What is {a} - {b}?", "{a} - {b} = {r}", lambda a, b: a - b),
    ("What is {a} times {b}?", "{a} * {b} = {r}", lambda a, b: a * b),
    (
        "{name} has {a} apples and buys {b} more. How many apples does {name} have now?",
        "{a} + {b} = {r}",
        lambda a, b: a + b,
    ),
]
# The task's own system prompt (a math task field): the kind's default asks for \boxed{} *and* a finish
# call, a format SmolLM2-135M did not produce once in the reward table; this one shows the format.
SYSTEM_PROMPT = "Answer with only the final number in \\boxed{}, for example \\boxed{7}."
CHOICE_PROMPT = "Answer with only the letter of the right choice, for example: B"
_NAMES = ["Tom", "Ana", "Li", "Sara", "Omar", "Mia"]


def arith_row(rng: random.Random) -> dict[str, Any]:
    """One GSM8K-format row; subtraction never goes below zero."""
    question, work, op = rng.choice(_TEMPLATES)
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    if op(a, b) < 0:
        a, b = b, a
    values = {"name": rng.choice(_NAMES), "a": a, "b": b, "r": op(a, b)}
    return {"question": question.format(**values), "answer": f"{work.format(**values)}\n#### {op(a, b)}"}


def arith_task(rng: random.Random) -> dict[str, Any]:
    """The row as a `math` task the API takes (format given, not detected)."""
    return {"kind": "math", "format": "gsm8k", "system_prompt": SYSTEM_PROMPT, **arith_row(rng)}


def choice_task(rng: random.Random) -> dict[str, Any]:
    """The same question as a multiple-choice `stem` task (ARC/MMLU-style row: question, choices, answer letter).

    The wrong choices are near misses (the answer +-1, +-2 or +3, none below 0), so a
    right pick takes the arithmetic, not just picking a number that looks plausible.
    """
    row = arith_row(rng)
    right = int(row["answer"].rsplit("#### ", 1)[1])
    wrong = [v for v in (right + 1, right - 1, right + 2, right - 2, right + 3) if v >= 0]  # 0 - 2 dropped at 0
    choices = [right, *rng.sample(wrong, 3)]
    rng.shuffle(choices)
    return {
        "kind": "stem",
        "system_prompt": CHOICE_PROMPT,
        "question": row["question"],
        "choices": [str(c) for c in choices],
        "answer": "ABCD"[choices.index(right)],
    }
