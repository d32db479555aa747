"""The package's layers: each imports only from below itself (training and retrieval are siblings
that never import each other), so there is no cycle and no upward import. The README's
"Architecture" section lists the same layers."""

import ast
from pathlib import Path

from conftest import ROOT

# bottom first; packages on one row are siblings
LAYERS = [
    {"choice", "io", "progress", "shipped"},
    {"precision"},
    {"runtime"},
    {"data"},
    {"models"},
    {"evaluation"},
    {"training", "retrieval"},
    {"reader"},
    {"pipeline"},
    {"gpu_check"},  # a tool over the stages (it drives the trainer, the encoder and torchrun), not a stage
    {"cli"},
    {"sweeps", "override_check"},  # a table's sweep over the composed configs: checked whole, its stage graph planned; a command line's keys
    {"command_help"},  # a command's --help, from its schema (override_check's walk)
    # the commands (taser-<name>, python -m taser.<name>): compose the config, call one pipeline function, print
    {"build_index", "convert_checkpoint", "demo", "download", "encode_passages", "evaluate", "experiment", "mine_negatives", "prepare_squad",
     "read", "report", "search", "train", "train_reader", "__main__"},  # __main__: a package's own command (taser/gpu_check/__main__.py)
]
RANK = {name: i for i, row in enumerate(LAYERS) for name in row}


def _imports(path: Path) -> set[str]:
    """The taser sub-packages a module imports, anywhere in it (function-level imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "taser" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_no_module_imports_upward_or_sideways():
    package = ROOT / "taser"
    wrong = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        own = relative.parts[0].removesuffix(".py")
        if own == "__init__":
            continue
        if relative.name == "__main__.py":  # a package's command (python -m taser.gpu_check): of the commands' layer
            own = "__main__"
        assert own in RANK, f"{relative}: add its package to LAYERS (and to the README's Architecture section)"
        for target in _imports(path) - {own}:
            if RANK[target] >= RANK[own]:
                wrong.append(f"taser/{relative} imports taser.{target}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_data_is_free_of_torch():
    for path in sorted((ROOT / "taser" / "data").rglob("*.py")):
        tree = ast.parse(path.read_text())
        modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        modules |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not modules & {"torch", "transformers"}, path


def _module_imports() -> dict[str, set[str]]:
    """taser module -> the taser modules it imports (anywhere in it, function-level imports too)."""
    root = Path(__file__).resolve().parents[1]
    modules = {}
    for path in (root / "taser").rglob("*.py"):
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def test_no_module_imports_one_that_imports_it_back():
    """Would catch a cycle between modules (e.g. backends -> onnx_backend -> backends), which the
    package-level check above does not see inside one package; a package's __init__ importing its
    own modules is not counted."""
    graph = {a: {b for b in targets if not (a.startswith(b + ".") or b.startswith(a + "."))} for a, targets in _module_imports().items()}
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
