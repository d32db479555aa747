"""`make` installs the tested set of versions (constraints.txt), not the newest release of each
dependency: a transformers release once broke every encoder load overnight."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
INSTALLED_EXTRAS = ("dev", "bm25", "fast")  # what the Makefile's install rule names


def pins() -> dict[str, Version]:
    found = {}
    for number, line in enumerate((ROOT / "constraints.txt").read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep and version, f"constraints.txt line {number}: not name==version: {line!r}"
        found[canonicalize_name(name)] = Version(version)
    return found


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = list(project["dependencies"])
    for extra in INSTALLED_EXTRAS:
        listed += project["optional-dependencies"][extra]
    return [Requirement(r) for r in listed]


def test_every_declared_dependency_is_pinned_within_its_declared_range():
    pinned = pins()
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement} (pyproject.toml) has no pin in constraints.txt: run make lock"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"constraints.txt pins {name}=={pinned[name]}, outside pyproject.toml's {requirement}")


def test_the_makefile_installs_with_the_constraints_and_torch_at_its_pin():
    makefile = (ROOT / "Makefile").read_text()
    install = re.search(r"^\$\(VENV\)/\.installed:(.*)\n\t(.*)$", makefile, re.M)
    assert install and "constraints.txt" in install.group(1), "the install stamp must be redone when the constraints change"
    assert "-c constraints.txt" in install.group(2)
    torch_pin = Version(re.search(r"^TORCH_PIN := torch==(\S+)$", makefile, re.M).group(1))
    assert pins()["torch"] == torch_pin
