"""The package's import graph has no cycle: modules import from the rows above them in the data flow
(spec -> blocks -> layers -> stacks -> models -> io / generation / training -> cli), never below.

Every import statement counts — at module level, under ``TYPE_CHECKING`` and inside functions — since a
deferred import that points back up the flow is still a loop in the design. ``from pkg import name``
counts as an import of ``pkg.name`` when that is a module, else of ``pkg`` itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "zoo"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in ROOT.rglob("*.py")}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *([base] if base else [])])
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in modules else base)
    return {m for m in found if m in modules and m != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_import_graph_has_no_cycle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# The data flow, bottom to top: a module may import from its own row or the rows below it. Rows with
# several packages are side by side: they may not import each other.
LAYERS = (
    ("zoo._lazy", "zoo._extras", "zoo.spec", "zoo.devices"),
    ("zoo.blocks",),
    ("zoo.layers",),
    ("zoo.stacks",),
    ("zoo.generation", "zoo.losses"),  # generation sees models only through its protocol
    ("zoo.models",),
    ("zoo.quant",),  # weight-only quantisation: checkpoints save and load quantised weights through it
    ("zoo.io",),
    ("zoo.lora", "zoo.export"),  # adapters (saved with io, exported in PEFT's format), torch.export/ONNX
    # models and tokenizers loaded by io: embeddings (training's contrastive task pools as it does); audio
    # (WAV, log-mel features, transcribe)
    ("zoo.embeddings", "zoo.audio"),
    ("zoo.serving",),  # the serving engine and its HTTP layer; training's grpo task samples through it
    ("zoo.analysis", "zoo.training"),
    ("zoo.evaluation",),  # lm-eval's adapter
    ("zoo.demo", "zoo.viz"),
    ("zoo.cli",),
    ("zoo.__main__",),
)


def _place(module: str) -> tuple[int, str] | None:
    for row, packages in enumerate(LAYERS):
        for package in packages:
            if module == package or module.startswith(package + "."):
                return row, package
    return None  # `zoo` itself: the public facade, which names everything lazily


def test_every_import_points_down_the_flow() -> None:
    modules = _modules()
    wrong = []
    for name, path in sorted(modules.items()):
        here = _place(name)
        for target in sorted(_imports(name, path, modules)):
            there = _place(target)
            if here is None or there is None:
                continue
            if there[0] > here[0] or (there[0] == here[0] and there[1] != here[1]):
                wrong.append(f"{name} -> {target}")
    assert not wrong, "imports against the flow: " + ", ".join(wrong)


def test_every_module_has_a_place_in_the_flow() -> None:
    assert [m for m in _modules() if _place(m) is None] == ["zoo"]
