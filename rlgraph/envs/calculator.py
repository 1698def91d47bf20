"""The built-in calculator tool: the model writes `<expression>`, the tool answers `=value`.

The expression is parsed and evaluated here, by a small recursive-descent parser over
integers, + - * / and parentheses (never Python's `eval`): anything else is a failed tool
call, answered `=error` and counted in `env/tool_success_rate`. A turn that calls no tool is
the final answer and ends the trajectory. Its task is `data.task: calc` (`37*8=` -> `296`).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

MAX_EXPRESSION_CHARS = 200  # a longer call is refused, not parsed
MAX_MAGNITUDE = 10**30  # a larger intermediate value is refused (no runaway powers of ten)
_CALL = re.compile(r"<([^<>]*)>\s*$")


class CalculatorError(ValueError):
    """An expression the calculator does not accept."""


class _Parser:
    """expr := term (('+'|'-') term)*; term := factor (('*'|'/') factor)*;
    factor := ('-'|'+') factor | integer | '(' expr ')'."""

    def __init__(self, text: str):
        self.text, self.pos = text.replace(" ", ""), 0

    def parse(self) -> Fraction:
        value = self._expr()
        if self.pos != len(self.text):
            raise CalculatorError(f"unexpected {self.text[self.pos]!r} at {self.pos}")
        return value

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _expr(self) -> Fraction:
        value = self._term()
        while self._peek() in ("+", "-") and self._peek():
            op = self._peek()
            self.pos += 1
            value = _checked(value + self._term() if op == "+" else value - self._term())
        return value

    def _term(self) -> Fraction:
        value = self._factor()
        while self._peek() in ("*", "/") and self._peek():
            op = self._peek()
            self.pos += 1
            right = self._factor()
            if op == "/" and right == 0:
                raise CalculatorError("division by zero")
            value = _checked(value * right if op == "*" else value / right)
        return value

    def _factor(self) -> Fraction:
        ch = self._peek()
        if ch in ("-", "+") and ch:
            self.pos += 1
            return -self._factor() if ch == "-" else self._factor()
        if ch == "(":
            self.pos += 1
            value = self._expr()
            if self._peek() != ")":
                raise CalculatorError("missing ')'")
            self.pos += 1
            return value
        start = self.pos
        while self._peek().isdigit() and self._peek():
            self.pos += 1
        if start == self.pos:
            raise CalculatorError(f"expected a number at {start}")
        return _checked(Fraction(int(self.text[start:self.pos])))


def _checked(value: Fraction) -> Fraction:
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError("value too large")
    return value


def evaluate(expression: str) -> str:
    """The value of an arithmetic expression as text: an integer, or a fraction `p/q` reduced;
    raises CalculatorError for anything that is not one."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    if not expression.strip():
        raise CalculatorError("empty expression")
    value = _Parser(expression).parse()
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"


class CalculatorEnv:
    """A tool the policy calls with `<expression>`; observations `=value` + newline. A turn
    without a call is the answer: the trajectory ends (reward 0: the reward node scores the
    answer). `demonstration` is the call a warm start teaches: the prompt's own expression."""

    stop = (">",)

    def __init__(self, **config: Any):
        if config:
            raise TypeError(f"calculator takes no keys, got {sorted(config)}")

    def reset(self, prompt: str, sample: dict) -> str:
        """No text after the prompt."""
        return ""

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Evaluate the call the turn ends with; a turn with no call ends the trajectory."""
        call = _CALL.search(action)
        if call is None:
            return "", 0.0, True, {}
        try:
            return f"={evaluate(call.group(1))}\n", 0.0, False, {"tool_call": True}
        except CalculatorError:
            return "=error\n", 0.0, False, {"tool_call": False}

    def demonstration(self, prompt: str, sample: dict) -> list[str] | None:
        """The turns a warm start teaches: call the tool on the prompt's expression, then
        answer with the ground truth."""
        expression = str(prompt).rsplit("=", 1)[0]
        return [f"<{expression}>", str(sample.get("ground_truth", ""))]
