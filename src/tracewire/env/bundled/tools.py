"""``tools``: calculator and unit-conversion tasks through the function-calling harness."""

from __future__ import annotations

import json
import math
from typing import Literal

from ...trace import Trace
from .. import Environment, Task, ToolsHarness, UnknownTool, final_text
from ._common import data_tasks, fmt, parse_answer

__all__ = ["calculator", "convert_units", "load_environment"]

Unit = Literal["km", "mi", "kg", "lb", "m", "ft", "C", "F", "l", "gal"]
_FACTORS = {("km", "mi"): 0.621371, ("mi", "km"): 1.609344, ("kg", "lb"): 2.204623,
            ("lb", "kg"): 0.453592, ("m", "ft"): 3.28084, ("ft", "m"): 0.3048,
            ("l", "gal"): 0.264172, ("gal", "l"): 3.785412}
_ALLOWED = set("0123456789+-*/(). ")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses.

    Args:
        expression: for example (3 + 4) * 5
    """
    if not expression or not set(expression) <= _ALLOWED or len(expression) > 200:
        raise ValueError("unsupported character")
    # Only digits, operators, parentheses and spaces reach eval, with no builtins.
    value = float(eval(expression, {"__builtins__": {}}, {}))
    if not math.isfinite(value):
        raise ValueError("result is not finite")
    return fmt(value)


def convert_units(value: float, from_unit: Unit, to_unit: Unit) -> str:
    """Convert a value from one unit to another."""
    v = float(value)
    if (from_unit, to_unit) == ("C", "F"):
        return fmt(v * 9 / 5 + 32)
    if (from_unit, to_unit) == ("F", "C"):
        return fmt((v - 32) * 5 / 9)
    return fmt(v * _FACTORS[(from_unit, to_unit)])


def _error(exc: BaseException) -> str:
    # The built-in model was trained on exactly these tool error texts.
    if isinstance(exc, UnknownTool):
        return f"Error: unknown tool {exc.name}"
    return f"Error: {type(exc).__name__}"


def correct(task: Task, trace: Trace) -> float:
    """1.0 when the final ``Answer: <number>`` equals the task's answer, else 0.0."""
    return 1.0 if parse_answer(final_text(trace)) == task["answer"] else 0.0


def used_expected_tool(task: Task, trace: Trace) -> float:
    """1.0 when the model called the tool the task expects with the expected arguments."""
    want = task["expected_call"]
    for node in trace.nodes:
        for call in node.message.tool_calls or ():
            try:
                args = json.loads(call.arguments)
            except ValueError:
                continue
            if call.name == want["name"] and args == want["arguments"]:
                return 1.0
    return 0.0


def load_environment() -> Environment:
    """The tools environment (160 tasks: calculator and ``convert_units``)."""
    return Environment(
        "tools",
        tasks=data_tasks("tools"),
        harness=ToolsHarness(
            [calculator, convert_units],
            prompt=lambda t: str(t["question"]),
            max_turns=3,
            format_error=_error,
        ),
        rewards=[correct],
        metrics=[used_expected_tool],
        sampling={"max_tokens": 96},
        description="Tool use: a calculator and unit conversions via function calling.",
    )
