"""The version a researcher pins: `taser.__version__`, the installed distribution's metadata and the
newest entry of CHANGELOG.md say the same."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version

import pytest
from conftest import ROOT
from packaging.version import Version

import taser

DISTRIBUTION = "taser-retrieval"


def newest_changelog_entry() -> str:
    headings = re.findall(r"^## (\d+\.\d+\.\d+\S*) \(\d{4}-\d{2}-\d{2}\)$", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert headings, "CHANGELOG.md has no `## X.Y.Z (date)` entry"
    return headings[0]


def test_the_version_is_a_release_version_and_the_changelog_opens_with_it():
    assert str(Version(taser.__version__)) == taser.__version__
    assert newest_changelog_entry() == taser.__version__, "a new version needs its CHANGELOG.md entry (and the reverse)"


def test_the_installed_distribution_carries_the_packages_version():
    try:
        installed = version(DISTRIBUTION)
    except PackageNotFoundError:
        pytest.skip(f"{DISTRIBUTION} is not installed in this environment (make install installs it)")
    assert installed == taser.__version__


def test_the_distribution_name_is_the_one_the_readme_and_pyproject_give():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(rf'^name = "{DISTRIBUTION}"$', pyproject, re.M)
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M) and 'version = {attr = "taser.__version__"}' in pyproject
    assert f'pip install "{DISTRIBUTION}' in (ROOT / "README.md").read_text(encoding="utf-8")
