"""The wheel a researcher installs with `pip install taser-retrieval`: built from the tracked files,
installed with its dependencies at the tested versions (constraints.txt) into a fresh virtual
environment outside the checkout, then used from an empty directory: `--help` of every console
command and of `python -m taser.<name>`, a tiny train -> encode -> index -> evaluate on the packaged
SQuAD data, and one row of the squad_cpu table through `taser-experiment`.

Nothing may read the checkout: every process of the installed environment carries an audit hook
(a `.pth` file in its site-packages) that records any file or directory of the checkout opened or
listed, and the test fails on any record. (`make test-cluster`: the install takes minutes.)"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = [pytest.mark.package, pytest.mark.slow]

TORCH_PIN = re.search(r"^TORCH_PIN := (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)

GUARD = '''
import os, sys
_root = os.environ.get("TASER_FORBIDDEN_ROOT")
_log = os.environ.get("TASER_FORBIDDEN_LOG")
if _root and _log:
    _fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    _watched = {"open", "os.listdir", "os.scandir", "os.chdir", "shutil.copytree", "os.exec"}
    def _hook(event, args, _fd=_fd, _root=os.path.realpath(_root) + os.sep):
        if event not in _watched or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        try:
            path = os.path.realpath(os.fsdecode(args[0]))
        except (TypeError, ValueError):
            return
        if (path + os.sep).startswith(_root):
            os.write(_fd, f"{os.getpid()} {event} {path}\\n".encode())
    sys.addaudithook(_hook)
'''


def tracked_tree(dest: Path) -> Path:
    """The working tree's tracked files (links kept as links) in `dest`: a build from there sees no stale build/ folder."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source, target = ROOT / name, dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, target)
    return dest


def run(args: list, cwd: Path, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, args))} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the environment's bin/, the environment variables of its commands, the guard's log)."""
    work = tmp_path_factory.mktemp("wheel")
    source = tracked_tree(work / "source")
    # the tests' PYTHONPATH names the checkout (conftest): nothing of this environment may see it
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", work / "dist", source], work, env)
    wheel = next((work / "dist").glob("taser_retrieval-*.whl"))
    venv = work / "venv"
    run([sys.executable, "-m", "venv", venv], work, env)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    run([*pip, TORCH_PIN], work, env, timeout=900)
    # bm25s (of the bm25 extra) for the table row's BM25 stage: pyserini's Lucene would add a JDK to the install
    run([*pip, "-c", ROOT / "constraints.txt", wheel, "bm25s"], work, env, timeout=900)
    site = Path(run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], work, env).stdout.strip())
    (site / "taser_test_guard.py").write_text(GUARD)
    (site / "taser_test_guard.pth").write_text("import taser_test_guard\n")
    log = work / "checkout-reads.log"
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               TASER_FORBIDDEN_ROOT=str(ROOT), TASER_FORBIDDEN_LOG=str(log))
    return wheel, venv / "bin", env, log


def wheel_contents():
    spec = importlib.util.spec_from_file_location("wheel_contents", ROOT / "tools" / "wheel_contents.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_lists_what_the_wheel_holds(installed):
    tool = wheel_contents()
    found = tool.contents(installed[0])
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    stated = re.search(rf"`{re.escape(found['wheel'])}`: ([\d.]+) MB, ([\d.]+) MB unpacked", readme)
    assert stated, f"README.md lists no contents of {found['wheel']}: paste `make wheel`'s table"
    unpacked = sum(size for _, size in found["parts"].values())
    assert abs(float(stated.group(1)) - found["bytes"] / 1e6) <= 0.25 * float(stated.group(1)), (stated.group(0), found["bytes"])
    assert abs(float(stated.group(2)) - unpacked / 1e6) <= 0.25 * float(stated.group(2)), (stated.group(0), unpacked)
    for what, (files, _) in found["parts"].items():
        assert f"| {what} |" in readme and files > 0, what


def checkout_reads(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def entry_points(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as z:
        text = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
    section = text.split("[console_scripts]", 1)[1].split("\n[", 1)[0]
    return dict(line.replace(" ", "").split("=", 1) for line in section.strip().splitlines())


def test_the_wheel_holds_the_library_its_configs_and_shipped_data_and_no_tests_or_benchmarks(installed):
    wheel = installed[0]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"taser", "hydra_plugins", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}, tops
    configs = {n.removeprefix("taser/configs/") for n in names if n.startswith("taser/configs/")}
    assert configs == {p.relative_to(ROOT / "configs").as_posix() for p in (ROOT / "configs").rglob("*.yaml")}
    assert "taser/data_files/squad/squad-v1.1-dev-40-articles.json" in names
    assert not [n for n in names if re.search(r"(^|/)(tests?|benchmarks|fixtures)/", n)]
    scripts = sorted(p.stem for p in (ROOT / "scripts").glob("*.py") if not p.name.startswith("_"))
    assert sorted(entry_points(wheel)) == sorted("taser-" + s.replace("_", "-") for s in scripts)


def test_every_command_answers_help_from_an_empty_directory_under_both_spellings(installed, tmp_path):
    wheel, bin_dir, env, log = installed
    calls = [args for command, target in entry_points(wheel).items()
             for args in ([bin_dir / command, "--help"], [bin_dir / "python", "-m", target.split(":")[0].removesuffix(".__main__"), "--help"])]
    with ThreadPoolExecutor(4) as pool:  # each call mostly imports: 28 of them one by one take 2 minutes
        for args, done in zip(calls, pool.map(lambda a: run(a, tmp_path, env, timeout=300), calls)):
            assert "Settings (key=value on the command line" in done.stdout, (args, done.stdout[:500])
    assert not checkout_reads(log), checkout_reads(log)[:10]
    assert not list(tmp_path.iterdir()), "--help wrote files"


def test_train_encode_index_evaluate_on_the_packaged_data_from_an_empty_directory(installed, tiny_pretrained, tmp_path):
    _, bin_dir, env, log = installed
    model = ["model=shared", f"model.pretrained={tiny_pretrained}", "model.max_length=64", "model.max_question_length=32"]
    run([bin_dir / "taser-prepare-squad", "out_dir=outputs/data/squad"], tmp_path, env)
    run([bin_dir / "taser-train", *model, "train.max_steps=2", "train.batch_size=4", "train.warmup_steps=0", "train.hard_negatives=0",
         "train.val_max_questions=0", "train.progress=false", "train.device=cpu", "train.precision=fp32", "output_dir=outputs/train/shared"], tmp_path, env)
    run([bin_dir / "taser-encode-passages", "checkpoint=outputs/train/shared/final", "batch_size=64", "precision=fp32", "device=cpu"], tmp_path, env)
    run([bin_dir / "taser-build-index", "embeddings=outputs/train/shared/embeddings"], tmp_path, env)
    done = run([bin_dir / "taser-evaluate", "checkpoint=outputs/train/shared/final", "index=outputs/train/shared/index", "precision=fp32",
                "device=cpu", "out_dir=outputs/eval/shared"], tmp_path, env)
    results = json.loads((tmp_path / "outputs" / "eval" / "shared" / "results.json").read_text())
    top = {int(k): v for k, v in results["top_k"].items()}
    assert results["questions"] == 1971 and results["model_type"] == "shared" and 0 <= top[1] <= top[100] <= 100, results
    assert results["summary"] in done.stdout
    assert not checkout_reads(log), checkout_reads(log)[:10]


def test_a_table_row_through_taser_experiment_from_an_empty_directory(installed, tiny_pretrained, tmp_path):
    _, bin_dir, env, log = installed
    run([bin_dir / "taser-experiment", "table=squad_cpu", "row=dpr-0neg", "seed=1", "smoke_steps=2", f"table.model.pretrained={tiny_pretrained}",
         "++table.model.max_length=64", "++table.model.max_question_length=32", "table.train.batch_size=2", "++table.train.precision=fp32",
         "++table.train.device=cpu", "table.evaluate.precision=fp32", "table.evaluate.device=cpu", "table.evaluate.bm25.backend=bm25s",
         "hydra.run.dir=outputs/run"], tmp_path, env)
    record = json.loads((tmp_path / "outputs" / "run" / "experiment.json").read_text())
    assert record["row"] == "dpr-0neg" and record["seed"] == 1, record
    assert (tmp_path / "outputs" / "experiments" / "stages").is_dir()  # the default store, under the working directory
    assert not checkout_reads(log), checkout_reads(log)[:10]
