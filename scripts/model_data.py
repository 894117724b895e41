"""Task data of the bundled environments, and the transcripts the built-in model learns from.

Used by ``scripts/train_model.py``; everything here is deterministic given the seed. The
formats (system prompts, user messages, tool schemas, feedback texts) are documented in
``src/tracewire/env/bundled/data/README.md`` and must stay in sync with it.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

from tracewire.env.bundled.guess import feedback  # the environment is the source of truth

ARITH_SYSTEM = "You are a math tutor. Show the calculation, then end with 'Answer: <number>'."
TOOLS_SYSTEM = ("You can call tools. Use a tool to compute the result, then reply with "
                "'Answer: <number>'.")
GUESS_SYSTEM = "You are playing a number guessing game. Reply with only your guess."
COMMAND_SYSTEM = "Answer with one word."

CALCULATOR = {"type": "function", "function": {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
    "parameters": {"type": "object", "properties": {
        "expression": {"type": "string", "description": "for example (3 + 4) * 5"}},
        "required": ["expression"]}}}
UNITS = ["km", "mi", "kg", "lb", "m", "ft", "C", "F", "l", "gal"]
CONVERT = {"type": "function", "function": {
    "name": "convert_units",
    "description": "Convert a value from one unit to another.",
    "parameters": {"type": "object", "properties": {
        "value": {"type": "number"},
        "from_unit": {"type": "string", "enum": UNITS},
        "to_unit": {"type": "string", "enum": UNITS}},
        "required": ["value", "from_unit", "to_unit"]}}}
TOOLS = [CALCULATOR, CONVERT]

FACTORS = {("km", "mi"): 0.621371, ("mi", "km"): 1.609344, ("kg", "lb"): 2.204623,
           ("lb", "kg"): 0.453592, ("m", "ft"): 3.28084, ("ft", "m"): 0.3048,
           ("l", "gal"): 0.264172, ("gal", "l"): 3.785412}


def fmt(x: float) -> str:
    """The one number format of tool results and answers: integers plain, else 4 decimals."""
    if abs(x - round(x)) < 1e-9:
        return str(round(x))
    return f"{x:.4f}".rstrip("0").rstrip(".")


def convert(value: float, src: str, dst: str) -> float:
    """The ``convert_units`` tool."""
    if (src, dst) == ("C", "F"):
        return value * 9 / 5 + 32
    if (src, dst) == ("F", "C"):
        return (value - 32) * 5 / 9
    return value * FACTORS[(src, dst)]


def calculate(expression: str) -> float:
    """The ``calculator`` tool (digits, + - * / parentheses and spaces only)."""
    if not expression or any(c not in "0123456789+-*/(). " for c in expression):
        raise ValueError("unsupported character")
    return float(eval(expression, {"__builtins__": {}}, {}))


NAMES = ["Sam", "Ana", "Lee", "Mia", "Tom", "Ivy", "Max", "Zoe", "Ben", "Eva", "Noah", "Lily"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cards", "books", "coins", "shells"]


def arithmetic(rng: random.Random, n: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        kind = ["add", "sub", "mul", "div"][i % 4]
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        if kind == "add":
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            c, op = a + b, "+"
            q = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have?"
        elif kind == "sub":
            a = rng.randint(20, 99)
            b = rng.randint(2, a - 1)
            c, op = a - b, "-"
            q = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
        elif kind == "mul":
            a, b = rng.randint(2, 12), rng.randint(2, 20)
            c, op = a * b, "*"
            q = f"There are {a} boxes with {b} {item} in each. How many {item} are there?"
        else:
            b, k = rng.randint(2, 9), rng.randint(2, 12)
            a, c, op = b * k, k, "/"
            q = f"{a} {item} are shared equally by {b} friends. How many {item} does each get?"
        rows.append({"key": f"arith-{i:04d}", "system": ARITH_SYSTEM, "question": q,
                     "answer": str(c), "a": a, "b": b, "op": op})
    return rows


def arithmetic_reply(row: dict[str, Any], result: int) -> str:
    return f"{row['a']} {row['op']} {row['b']} = {result}. Answer: {result}"


def tool_tasks(rng: random.Random, n: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        if i % 2 == 0:
            a, b, c = rng.randint(11, 99), rng.randint(2, 40), rng.randint(2, 9)
            op1, op2 = rng.choice("+-*"), rng.choice("+*")
            expr = f"({a} {op1} {b}) {op2} {c}" if i % 4 == 0 else f"{a} {op1} {b}"
            q = f"Use the calculator to compute {expr}."
            call = {"name": "calculator", "arguments": {"expression": expr}}
            answer = fmt(calculate(expr))
        else:
            src, dst = rng.choice([*FACTORS, ("C", "F"), ("F", "C")])
            value = rng.randint(2, 120)
            q = f"Convert {value} {src} to {dst}."
            call = {"name": "convert_units",
                    "arguments": {"value": value, "from_unit": src, "to_unit": dst}}
            answer = fmt(convert(value, src, dst))
        rows.append({"key": f"tools-{i:04d}", "system": TOOLS_SYSTEM, "question": q,
                     "answer": answer, "tool": call["name"], "expected_call": call})
    return rows


def run_tool(name: str, arguments: str) -> str:
    """The tool result text the environment sends back (``Error: ...`` on bad calls)."""
    try:
        args = json.loads(arguments)
        if name == "calculator":
            return fmt(calculate(str(args["expression"])))
        if name == "convert_units":
            return fmt(convert(float(args["value"]), str(args["from_unit"]), str(args["to_unit"])))
        return f"Error: unknown tool {name}"
    except Exception as exc:  # every failure becomes a tool error message
        return f"Error: {type(exc).__name__}"


def tool_final(row: dict[str, Any], call: dict[str, Any], result: str) -> str:
    if call["name"] == "calculator":
        return f"{call['arguments']['expression']} = {result}. Answer: {result}"
    a = call["arguments"]
    return f"{a['value']} {a['from_unit']} is {result} {a['to_unit']}. Answer: {result}"


def corrupt_call(rng: random.Random, call: dict[str, Any]) -> dict[str, Any]:
    args = dict(call["arguments"])
    if call["name"] == "calculator":
        expr = args["expression"]
        digits = [i for i, ch in enumerate(expr) if ch.isdigit()]
        j = rng.choice(digits)
        new = str((int(expr[j]) + rng.randint(1, 8)) % 10)
        if j == 0 and new == "0":
            new = "1"
        args["expression"] = expr[:j] + new + expr[j + 1 :]
    else:
        args["value"] = args["value"] + rng.choice([-10, -1, 1, 10])
    return {"name": call["name"], "arguments": args}


def guess_tasks(rng: random.Random, n: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        low, high = [(1, 20), (1, 50), (1, 100)][i % 3]
        max_turns = math.ceil(math.log2(high - low + 2)) - 1
        rows.append({"key": f"guess-{i:04d}", "system": GUESS_SYSTEM,
                     "first_message": guess_intro(low, high, max_turns),
                     "secret": rng.randint(low, high), "low": low, "high": high,
                     "max_turns": max_turns})
    return rows


def guess_intro(low: int, high: int, max_turns: int) -> str:
    return (f"I am thinking of a number from {low} to {high}. You have {max_turns} guesses. "
            "What is your first guess?")


def guess_game(rng: random.Random, row: dict[str, Any]) -> list[dict[str, Any]]:
    """One noisy-bisection game as chat messages."""
    lo, hi = row["low"], row["high"]
    msgs: list[dict[str, Any]] = [{"role": "system", "content": row["system"]},
                                  {"role": "user", "content": row["first_message"]}]
    for _ in range(row["max_turns"]):
        g = (lo + hi) // 2
        if rng.random() < 0.35:
            g = min(hi, max(lo, g + rng.choice([-3, -2, -1, 1, 2, 3])))
        msgs.append({"role": "assistant", "content": str(g)})
        fb = feedback(row["secret"], str(g))
        msgs.append({"role": "user", "content": fb})
        if fb == "Correct!":
            break
        lo, hi = (g + 1, hi) if fb == "Higher." else (lo, g - 1)
    return msgs


CAPITALS = ("France Paris,Germany Berlin,Italy Rome,Spain Madrid,Portugal Lisbon,Japan Tokyo,"
            "China Beijing,Egypt Cairo,Kenya Nairobi,Peru Lima,Chile Santiago,Canada Ottawa,"
            "Russia Moscow,Greece Athens,Norway Oslo,Sweden Stockholm,Finland Helsinki,"
            "Denmark Copenhagen,Poland Warsaw,Austria Vienna,Hungary Budapest,Ireland Dublin,"
            "Belgium Brussels,Switzerland Bern,Turkey Ankara,Iran Tehran,Iraq Baghdad,"
            "Thailand Bangkok,Vietnam Hanoi,Indonesia Jakarta,Australia Canberra,Cuba Havana,"
            "Colombia Bogota,Nigeria Abuja,Ghana Accra,Morocco Rabat,Romania Bucharest,"
            "Bulgaria Sofia,Serbia Belgrade,Ukraine Kyiv,Philippines Manila,Nepal Kathmandu")
OPPOSITES = ("hot cold,tall short,happy sad,open closed,early late,wet dry,full empty,"
             "hard soft,loud quiet,rich poor,strong weak,thick thin,win lose,push pull,buy sell,"
             "give take,above below,inside outside,first last,true false,day night,left right,"
             "north south,east west,cheap expensive,clean dirty,heavy light,begin end")
PLURALS = ("mouse mice,child children,man men,woman women,tooth teeth,foot feet,goose geese,"
           "person people,box boxes,city cities,leaf leaves,knife knives,wolf wolves,"
           "baby babies,bus buses,cactus cacti,ox oxen,sheep sheep,fish fish,deer deer,"
           "hero heroes,potato potatoes,tomato tomatoes,wife wives,party parties,"
           "church churches,glass glasses,fox foxes,key keys")


def command_tasks() -> list[dict[str, Any]]:
    rows = []
    groups = [("capital", CAPITALS, "What is the capital of {}?"),
              ("opposite", OPPOSITES, "What is the opposite of {}?"),
              ("plural", PLURALS, "What is the plural of {}?")]
    for kind, table, question in groups:
        for j, pair in enumerate(table.split(",")):
            word, answer = pair.split(" ")
            rows.append({"key": f"command-{kind}-{j:03d}", "system": COMMAND_SYSTEM,
                         "question": question.format(word), "answer": answer, "kind": kind})
    return rows


def command_correct(reply: str, answer: str) -> bool:
    """How the command environment scores a reply."""
    return reply.strip().rstrip(".").lower() == answer.lower()
