"""The package's layers: each imports only from below itself (training and retrieval are siblings
that never import each other), so there is no cycle and no upward import. The README's
"Architecture" section lists the same layers."""

import ast
from pathlib import Path

from conftest import ROOT

# bottom first; packages on one row are siblings
LAYERS = [
    {"choice", "io", "progress"},
    {"precision"},
    {"runtime"},
    {"data"},
    {"models"},
    {"evaluation"},
    {"training", "retrieval"},
    {"reader"},
    {"pipeline"},
    {"cli"},
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
