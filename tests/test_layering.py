"""The import graph of ``src/tracewire`` follows docs/ARCHITECTURE.md's picture of the parts.

Every import is read from the source (module level, inside functions, under
``TYPE_CHECKING``), so a lazy import counts as much as a top-level one. The allowed
part-to-part arrows are parsed from the ``layers`` block of docs/ARCHITECTURE.md, so the
document and this test cannot drift apart.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "tracewire"
DOC = ROOT / "docs" / "ARCHITECTURE.md"

#: Modules at the package root that every part may use (they import nothing of ours
#: but each other).
SHARED = {"_children", "_command", "_errors", "_memory", "_diagnostics", "_version", "_wire_errors"}
#: The package root and the command line: they wire everything, so they may import any part
#: (but only its public names: the command line takes each part's public command object).
TOP = {"__init__", "__main__", "cli"}


@dataclass
class Module:
    name: str  # dotted, e.g. "tracewire.proxy._server"
    path: Path
    is_pkg: bool
    imports: list[tuple[str, str, int]] = field(default_factory=list)  # (target, name, line)


def _modules() -> dict[str, Module]:
    mods: dict[str, Module] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        mods[".".join(parts)] = Module(".".join(parts), path, is_pkg)
    return mods


def _resolve(mod: Module, level: int, name: str | None) -> str:
    base = mod.name.split(".")
    if not mod.is_pkg:
        base.pop()
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _scan(mods: dict[str, Module]) -> None:
    for mod in mods.values():
        tree = ast.parse(mod.path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "tracewire":
                        mod.imports.append((alias.name, "", node.lineno))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    target = _resolve(mod, node.level, node.module)
                elif node.module and node.module.split(".")[0] == "tracewire":
                    target = node.module
                else:
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in mods:
                        mod.imports.append((sub, "", node.lineno))
                    else:
                        mod.imports.append((target, alias.name, node.lineno))


MODS = _modules()
_scan(MODS)


def part_of(name: str) -> str:
    """``tracewire.proxy._server`` -> ``proxy``; ``tracewire._errors`` -> ``_errors``."""
    bits = name.split(".")
    return bits[1] if len(bits) > 1 else "__init__"


def _edges() -> Iterator[tuple[Module, str, str, int]]:
    for mod in MODS.values():
        for target, name, line in mod.imports:
            if target in MODS and target != mod.name:
                yield mod, target, name, line


def allowed_arrows() -> dict[str, set[str]]:
    """Parse the ``layers`` block of docs/ARCHITECTURE.md: ``part -> other, other``."""
    text = DOC.read_text(encoding="utf-8")
    m = re.search(r"```layers\n(.*?)```", text, re.S)
    assert m, "docs/ARCHITECTURE.md needs a ```layers block (part -> parts it may import)"
    arrows: dict[str, set[str]] = {}
    for raw in m.group(1).splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        left, _, right = line.partition("->")
        arrows[left.strip()] = {p.strip() for p in right.split(",") if p.strip()}
    return arrows


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path, or None (iterative DFS, three colours)."""
    colour: dict[str, int] = {}
    for start in sorted(graph):
        if colour.get(start):
            continue
        stack: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            elif not colour.get(nxt):
                colour[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(sorted(graph.get(nxt, ())))))
    return None


def test_the_scan_sees_lazy_and_type_checking_imports() -> None:
    # Guard against a scanner that silently sees nothing: the facade's typed imports sit
    # under TYPE_CHECKING and the CLI imports its commands inside functions.
    facade = {part_of(t) for t, _, _ in MODS["tracewire"].imports}
    assert {"trace", "proxy", "store"} <= facade
    assert len(list(_edges())) > 100


def test_no_cycle_between_parts() -> None:
    graph: dict[str, set[str]] = {}
    for mod, target, _, _ in _edges():
        a, b = part_of(mod.name), part_of(target)
        graph.setdefault(a, set())
        if a != b:
            graph[a].add(b)
    assert _cycle(graph) is None, f"cycle between parts: {' -> '.join(_cycle(graph) or [])}"


def test_no_cycle_between_modules() -> None:
    # A package's __init__ importing its own submodules is the normal shape; a submodule
    # importing back through its package's __init__ (or two modules importing each other)
    # is the cycle this catches.
    graph: dict[str, set[str]] = {m: set() for m in MODS}
    for mod, target, _, _ in _edges():
        if MODS[target].is_pkg and mod.name.startswith(target + "."):
            continue  # `from . import x` inside the package resolves to the submodule
        graph[mod.name].add(target)
    cycle = _cycle(graph)
    assert cycle is None, f"cycle between modules: {' -> '.join(cycle or [])}"


def test_every_part_to_part_arrow_is_declared() -> None:
    arrows = allowed_arrows()
    bad = []
    for mod, target, _, line in _edges():
        a, b = part_of(mod.name), part_of(target)
        if a == b or b in SHARED or a in TOP:
            continue
        if b in TOP:
            bad.append(f"{mod.path.relative_to(ROOT)}:{line} imports {target} (the top)")
        elif b not in arrows.get(a, set()):
            bad.append(f"{mod.path.relative_to(ROOT)}:{line}: {a} -> {b} is not declared")
    assert not bad, "\n".join(sorted(set(bad)))


def test_the_declared_arrows_name_real_parts() -> None:
    parts = {part_of(m) for m in MODS} - TOP - SHARED
    arrows = allowed_arrows()
    assert set(arrows) == parts, f"layers block vs parts: {set(arrows) ^ parts}"
    for a, targets in arrows.items():
        assert targets <= parts, f"{a} -> unknown {targets - parts}"


def test_no_private_names_across_modules() -> None:
    bad = []
    for mod, target, name, line in _edges():
        if name.startswith("_") and not name.startswith("__"):
            bad.append(f"{mod.path.relative_to(ROOT)}:{line} imports {name} from {target}")
        if part_of(mod.name) != part_of(target) and part_of(target) not in SHARED:
            private = [b for b in target.split(".")[2:] if b.startswith("_")]
            if private:
                bad.append(f"{mod.path.relative_to(ROOT)}:{line} reaches into {target}")
    assert not bad, "\n".join(sorted(set(bad)))


def _literal_prefix(arg: ast.expr) -> str:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value)
    return ""


def test_no_imports_by_string() -> None:
    # importlib.import_module("tracewire....") hides an arrow from this test and from mypy;
    # only user-named modules (an environment, a runner factory) may be imported by name.
    bad = []
    for mod in MODS.values():
        for node in ast.walk(ast.parse(mod.path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
                and node.args
                and _literal_prefix(node.args[0]).startswith("tracewire")
            ):
                bad.append(f"{mod.path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "import_module of our own modules (use a plain import): " + ", ".join(bad)


#: A string naming one of our modules the way an import spec does: ``tracewire.x.y`` or
#: ``tracewire.x.y:attribute``.
_SPEC = re.compile(r"tracewire(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_][\w.]*)?")


def _string_imports(mod: Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(mod.path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if not _SPEC.fullmatch(node.value):
            continue
        module, colon, _ = node.value.partition(":")
        if module not in MODS:
            continue  # a logger name, an option key, a label: no module of ours
        if colon or part_of(module) != part_of(mod.name):
            yield node.lineno, node.value


def test_no_module_named_by_a_string() -> None:
    # A "tracewire.part:attr" spec (a runner factory, an entry point) or a string naming
    # another part's module is an import this test and mypy cannot see: pass the object
    # (serve.factory_ref names a function for worker processes). Only the package root's
    # lazy facade names modules as strings; within a part a module may name its own
    # part's modules (package data, bundled environments, `python -m` of a worker).
    bad = [f"{mod.path.relative_to(ROOT)}:{line} names {text!r}"
           for mod in MODS.values() if part_of(mod.name) not in TOP
           for line, text in _string_imports(mod)]
    assert not bad, "\n".join(bad)


def test_the_string_scan_sees_a_spec(tmp_path: Path) -> None:
    # Guard against a scanner that never matches: a module of serve naming compose's
    # factory is caught, its own worker module by name is not.
    path = tmp_path / "_fake.py"
    path.write_text('A = "tracewire.compose:env_factory"\n'
                    'B = "tracewire.serve._worker"\n'
                    'C = "tracewire.serve._runner:standin_factory"\n', encoding="utf-8")
    fake = Module("tracewire.serve._fake", path, False)
    assert [text for _, text in _string_imports(fake)] == [
        "tracewire.compose:env_factory", "tracewire.serve._runner:standin_factory"]


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph.get(todo.pop(), set()) - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_the_model_and_the_tokenizer_core_stand_below_the_proxy() -> None:
    # The built-in model and the viewer reuse the tokenizer/template core; neither may
    # reach the proxy through it (tito's TokenUpstream is the only tito module that may).
    graph: dict[str, set[str]] = {}
    for mod, target, _, _ in _edges():
        a, b = part_of(mod.name), part_of(target)
        if a != b and b not in SHARED:
            graph.setdefault(a, set()).add(b)
    for part in ("tokens", "model", "view"):
        assert "proxy" not in _reach(graph, part), f"{part} reaches the proxy"
        assert "proxy" not in _reach(allowed_arrows(), part), f"{part} may reach the proxy"
    tito_to_proxy = {mod.name for mod, target, _, _ in _edges()
                     if part_of(mod.name) == "tito" and part_of(target) == "proxy"}
    assert tito_to_proxy == {"tracewire.tito._token_upstream"}
