# `make demo` and `make test` set everything up on a fresh machine, then do their job.
# Stamps make re-runs skip what is already installed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIN := torch==2.13.0

.PHONY: demo docs gpu-check test test-cluster install clean-venv peers-fast-env

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	touch $@

# Torch first: an unpinned torch pulled by a dependency would be a multi-GB CUDA build.
$(VENV)/.torch: $(VENV)/.created
	$(PIP) install --quiet $(TORCH_PIN)
	touch $@

# constraints.txt: the versions the tests last passed with (a new transformers release once broke CI overnight).
# (The distribution was named `taser` before it had a wheel: a .venv from then holds that editable install too; it goes.)
$(VENV)/.installed: $(VENV)/.torch pyproject.toml constraints.txt
	$(PIP) install --quiet -c constraints.txt -e '.[dev,bm25,fast,openvino]'
	$(PIP) uninstall --quiet --yes taser 2>/dev/null || true
	touch $@

# After a deliberate upgrade inside .venv has passed make test: record the tested set.
.PHONY: lock
lock: $(VENV)/.installed
	{ sed -n '1,3p' constraints.txt; $(PIP) freeze --exclude-editable | grep -viE '^(taser|-e )' | sed 's/+cpu$$//'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

install: $(VENV)/.installed

# The wheel of a release (dist/), what `pip install taser-retrieval` installs (README, "Installing
# without a clone"); build/ goes first, as a stale one would put removed modules into the wheel.
.PHONY: wheel
wheel: $(VENV)/.installed
	rm -rf build dist/taser_retrieval-*
	$(PIP) wheel --no-deps --quiet -w dist .
	$(PY) tools/wheel_contents.py dist/taser_retrieval-*.whl

demo: $(VENV)/.installed
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) scripts/demo.py

# The demo in about a minute: the first 8 articles (6 train, 2 evaluate), 20 steps of 8 questions, BM25 by bm25s.
QUICKSTART_SETTINGS := articles=8 train_articles=6 train.max_steps=20 train.batch_size=8 train.warmup_steps=2 train.val_max_questions=0 bm25.backend=bm25s out_dir=outputs/quickstart
.PHONY: quickstart
quickstart: $(VENV)/.installed
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) scripts/demo.py $(QUICKSTART_SETTINGS)

# On a GPU machine, first: DPR and TASER train a few steps on one GPU and then on all of them, the
# loss checked against the CPU; writes outputs/gpu_check/results.md. Extra settings: GPU_CHECK_ARGS.
GPU_CHECK_ARGS ?=
gpu-check: $(VENV)/.installed
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) scripts/gpu_check.py $(GPU_CHECK_ARGS)

# The documentation site (docs/ -> site/); strict: a broken link or a missing page is an error (not --quiet, which hides the warnings strict counts).
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The site served at http://127.0.0.1:8000, rebuilt on every edit (another address: make docs-serve DOCS_ADDR=0.0.0.0:8000).
# Without a server: `make docs`, then open site/index.html from disk (search works there too).
.PHONY: docs-serve
docs-serve: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict --dev-addr $(or $(DOCS_ADDR),127.0.0.1:8000)

test: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $(VENV)/site-check
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) -m pytest -q -rs --durations=15 -m "not cluster and not package and not openvino and not isolated and not rehearsal" -n auto --dist worksteal
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) -m pytest -q -rs -m isolated -p no:xdist

# The cluster rehearsal: a real single-node SLURM (Debian's slurm-wlm and munge, which .ci/run installs) runs the
# documented cluster commands at tiny scale (tests/test_cluster.py); skipped with the reason where SLURM is absent.
# One worker per test file (a SLURM file's cluster is a module fixture; the chaos test's halves are two files). The
# jobs mostly wait on SLURM and on each other, so 4 workers fit on 2 cores. (pytest-xdist 3.8's loadgroup does not
# group under pytest 9.2: it renames a node id pytest no longer reads.)
# Also the installed package (tests/test_wheel.py, marker `package`): the wheel built, installed into a fresh environment
# outside the checkout and used from an empty directory; its install takes minutes, so it runs here, beside the cluster.
test-cluster: $(VENV)/.installed
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) -m pytest -q -rs --durations=10 -m "cluster or package" -n 4 --dist loadfile

# The long rehearsals (marker `rehearsal`): real process trees end to end, tens of seconds each (torchrun ranks,
# submitit's executor, a kill and resume, a compile cache, the README's steps in a fresh shell); and the OpenVINO
# backend's tests, which compile OpenVINO models in a pytest process of their own (tests/test_openvino_backend.py).
# make test leaves them here to stay under 10 minutes on 2 cores; CI runs them after make test.
.PHONY: test-long
test-long: $(VENV)/.installed
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) -m pytest -q -rs --durations=10 -m rehearsal -n auto --dist worksteal
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) -m pytest -q -rs -m openvino -n auto --dist worksteal

# Mutation testing of one library module (slow, not in CI): make mutants MODULE=taser/pipeline/stages.py [TESTS="tests/a.py tests/b.py"]
# Prints the score and each surviving mutant; records the score in benchmarks/mutants/results.md (tools/mutants.py).
MODULE ?=
TESTS ?=
.PHONY: mutants
mutants: $(VENV)/.installed
	@test -n "$(MODULE)" || { echo "name the module: make mutants MODULE=taser/pipeline/stages.py"; exit 2; }
	$(PY) tools/mutants.py $(MODULE) $(if $(TESTS),--tests $(TESTS))

# benchmarks/peers/encode.py only: sentence-transformers with its onnx and openvino backends, in an
# environment of its own (they need transformers 4.x; taser needs 5.x).
PEERS_FAST := .venv-peers-fast
$(PEERS_FAST)/.installed: benchmarks/peers/requirements-fast.txt
	$(PYTHON) -m venv $(PEERS_FAST)
	$(PEERS_FAST)/bin/python -m pip install --quiet $(TORCH_PIN)
	$(PEERS_FAST)/bin/python -m pip install --quiet -r benchmarks/peers/requirements-fast.txt
	touch $@

peers-fast-env: $(PEERS_FAST)/.installed

clean-venv:
	rm -rf $(VENV) $(PEERS_FAST)
