"""Built-in tasks that need no files, fully determined by their parameters and seed.

`arithmetic`: "What is 47 + 8?" answered as 'Answer: N', graded numerically.
`arithmetic_mc`: the same problems as four-option multiple choice with near-miss
distractors (off by 1, 2, 10, ...), for recognition on small models.
`copy`: "Repeat this number: 47", answered and graded as `arithmetic` is: a task a small
chat model does reliably (the demo model answers 23 of 24), so its right answers are
not guesses that any perturbation moves. Localising a planted failure needs such a
healthy panel: on `arithmetic` silencing any one MLP block of the demo model changes
most of its own answers, on `copy` silencing most blocks changes one or none.

Difficulty: the first operand has `digits` digits, the second 1..`digits` (so the
default, digits=2, mixes 2+2 and 2+1 digit sums: a 135M chat model gets some right
greedily and more under sampling). Multiplication uses one digit fewer on each side
(digits=3, ops="+*" gives 3-digit sums and 2-digit products). The generation
parameters are recorded in `source`, hence in every run manifest.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from typing import Callable

from .base import LETTERS, MultipleChoiceTask, Question
from .numeric import NumericTask

_OPS: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_INSTRUCTION = "Give only the final number, as 'Answer: N'."


class Arithmetic(NumericTask):
    name = "arithmetic"
    instruction = _INSTRUCTION
    # Enough for "Answer: 1234" plus a little preamble; longer only buys rambling.
    max_new_tokens = 24


class Copy(Arithmetic):
    name = "copy"


class ArithmeticMC(MultipleChoiceTask):
    name = "arithmetic_mc"


def _operand(rng: random.Random, n_digits: int) -> int:
    return rng.randint(10 ** (n_digits - 1) if n_digits > 1 else 1, 10**n_digits - 1)


def _problems(n: int, seed: int, digits: int, ops: str) -> list[tuple[int, str, int, int]]:
    """(a, op, b, result) tuples; subtraction keeps a >= b so results are not negative."""
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    if not ops or any(op not in _OPS for op in ops):
        raise ValueError(f"ops must be made of {''.join(_OPS)!r}, got {ops!r}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        op = rng.choice(ops)
        d = max(1, digits - 1) if op == "*" else digits
        a, b = _operand(rng, d), _operand(rng, rng.randint(1, d))
        if op == "-" and b > a:
            a, b = b, a
        out.append((a, op, b, _OPS[op](a, b)))
    return out


def _source(kind: str, **params: object) -> str:
    return f"synthetic:{kind}(" + ",".join(f"{k}={v!r}" for k, v in params.items()) + ")"


def parse_source(source: str) -> tuple[str, dict[str, object]] | None:
    """The generator name and parameters `_source` wrote (its inverse), or None when
    `source` is not a synthetic task's."""
    m = re.fullmatch(r"synthetic:(\w+)\((.*)\)", source)
    if m is None:
        return None
    call = ast.parse(f"f({m.group(2)})", mode="eval").body
    return m.group(1), {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}  # type: ignore[attr-defined]


def arithmetic(n: int = 200, seed: int = 0, digits: int = 2, ops: str = "+") -> Arithmetic:
    questions = [
        Question(
            id=f"arith-{i}",
            text=f"What is {a} {op} {b}?",
            answer=str(r),
            meta={"a": a, "op": op, "b": b},
        )
        for i, (a, op, b, r) in enumerate(_problems(n, seed, digits, ops))
    ]
    return Arithmetic(questions, source=_source("arithmetic", n=n, seed=seed, digits=digits, ops=ops))


def copy_numbers(n: int = 200, seed: int = 0, digits: int = 2) -> Copy:
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    rng = random.Random(seed)
    numbers = [_operand(rng, digits) for _ in range(n)]
    return Copy([Question(id=f"copy-{i}", text=f"Repeat this number: {x}", answer=str(x)) for i, x in enumerate(numbers)],
                source=_source("copy", n=n, seed=seed, digits=digits))


def _distractors(rng: random.Random, gold: int, k: int) -> list[int]:
    near = {gold + d for d in (1, -1, 2, -2, 10, -10, 9, 11, -9, -11, 100, -100)}
    pool = sorted(x for x in near if x >= 0 and x != gold)
    return rng.sample(pool, k)


def arithmetic_mc(
    n: int = 200, seed: int = 0, digits: int = 2, ops: str = "+", n_choices: int = 4
) -> ArithmeticMC:
    if not 2 <= n_choices <= 7:  # the near-miss pool of a result >= 0 has at least 6
        raise ValueError(f"n_choices must be 2..7, got {n_choices}")
    # A separate stream, so the problems are exactly those of `arithmetic` with this seed.
    rng = random.Random(f"{seed}:choices")
    questions = []
    for i, (a, op, b, r) in enumerate(_problems(n, seed, digits, ops)):
        options = _distractors(rng, r, n_choices - 1)
        gold = rng.randrange(n_choices)
        options.insert(gold, r)
        questions.append(
            Question(
                id=f"arith-mc-{i}",
                text=f"What is {a} {op} {b}?",
                answer=LETTERS[gold],
                choices=tuple(str(x) for x in options),
                gold_index=gold,
                meta={"a": a, "op": op, "b": b, "result": r},
            )
        )
    params = dict(n=n, seed=seed, digits=digits, ops=ops, n_choices=n_choices)
    return ArithmeticMC(questions, source=_source("arithmetic_mc", **params))
