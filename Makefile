# Two commands on a fresh machine: `make demo` and `make test` (`make test-fast` skips the slow tests).
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-workers test-pandas3 setup lint lean bench clean browser postgres axe

# pandas below 3 for .venv (a constraint, not a pin of the package): `make test` runs under pandas
# 2.3, `make test-pandas3` under pandas 3 (a fresh resolve of [all,test] would pick pandas 3 and an
# older lifelines, 0.30.0, the newest uv finds without a pandas<3 bound).
# torch first, pinned, with pip (pip.conf finds the CPU wheel on this machine's disk): a looser spec
# would fetch a multi-GB CUDA build. The rest with uv, which keeps that torch (it satisfies every
# range) and resolves in ~3 s where pip took ~25 s of CPU (it parses every index page's links).
# No bytecode compiled up front (pip --no-compile; uv's default: compiling all ~18 000 files took
# ~20 s); Python compiles what is imported and writes it once, which is why the targets below
# must not inherit PYTHONDONTWRITEBYTECODE (set in some shells and CI images: every process of the
# suite would then compile torch again, ~1 s each).
unexport PYTHONDONTWRITEBYTECODE
$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile torch==2.13.0 'uv>=0.5,<1'
	echo 'pandas<3' > $(VENV)/pandas2.txt
	$(BIN)/uv pip install -q --python $(BIN)/python -c $(VENV)/pandas2.txt -e '.[all,test]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/clinograph demo

# The report test opens report.html in a real headless Chromium (Debian packages).
browser:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver)

# The report tests run axe-core (pinned, from npm) on every rendered report, in that Chromium.
AXE := $(VENV)/axe/node_modules/axe-core/axe.min.js
$(AXE): | $(STAMP)
	@command -v npm >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm)
	npm install --no-save --no-audit --no-fund --prefix $(VENV)/axe axe-core@4.10.3

axe: $(AXE)

# The OMOP tests start their own PostgreSQL server in a temporary cluster (Debian package).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql)

# The lean server install, .venv-server: `pip install -e '.[server]'` (no torch, PyG, Opacus,
# pgmpy). tests/test_lean_install.py runs the server and `clinograph audit` from it. Rebuilt
# from scratch only when pyproject.toml or setup.py change (tests/lean_env.py keeps a stamp).
lean: $(STAMP)
	$(BIN)/python tests/lean_env.py

# Three pytest-xdist workers on two cores: the real-process Flower tests partly wait (a SuperNode
# polls every 3 s), so two workers both in such a test leave a core idle; tests/conftest.py lets
# at most two such long units run at once (each message starts three ClientApp processes, which
# starve the CPU when more run together: -n 4 timed Flower tests out), the third worker takes
# the short tests. --dist loadscope: a module is one unit (its fixtures built once), longest
# first; the units and the order are in tests/conftest.py. --durations=25: the slowest tests.
# A short temporary root per run: a hospital's worker listens on a local socket in its state
# directory, and a socket path has at most 100 characters (/tmp/pytest-of-<user>/pytest-<n>/
# popen-gw<k>/<test>/sites/h1/state/... is longer under xdist).
XDIST := -n 3 --dist loadscope
# .venv-server (the lean install, a few seconds with uv) is not a prerequisite: the first test that
# needs it builds it under a file lock (tests/lean_env.py) while the other workers run tests.
test: $(STAMP) browser postgres $(AXE)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST) --durations=25 \
	  --basetemp=$$(mktemp -d /tmp/cgt.XXXXXX)

# Everything not marked slow (no .venv-server, no browser install, no multi-process federations).
test-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadscope -m "not slow" \
	  --basetemp=$$(mktemp -d /tmp/cgt.XXXXXX)

# The simulation-heavy tests again with every `workers = "auto"` simulation on 2 worker processes
# (tests/force_workers.py; not test_parallel_hospitals.py, which tests "auto" itself): on a busy
# machine "auto" mostly stays serial, so `make test` alone leaves the worker path to that one
# module. One pytest process, no xdist: its workers run an I/O thread, and a fork copies a thread's
# held locks. Not part of `make test` (about 5 minutes); .ci/run runs it after.
WORKER_TESTS := tests/sdk/federation tests/sdk/privacy tests/sdk/concepts tests/sdk/fednsl tests/sdk/agat \
  tests/clinograph/test_cli.py tests/secure/audit tests/examples tests/integration/test_simulation_matches_flower.py
test-workers: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -p no:cacheprovider -p tests.force_workers \
	  $(WORKER_TESTS) --ignore tests/sdk/federation/test_parallel_hospitals.py --basetemp=$$(mktemp -d /tmp/cgt.XXXXXX)

# The table readers again under pandas 3, what `pip install 'clinograph[hospital]'` (and a fresh
# [all]) resolves today: .venv-pandas3, built like .venv with uv and pandas>=3 asked for (a resolve
# that cannot give it fails here), then the ingest, datasets and CLI tests not marked slow (~380
# tests, ~30 s; ~1 min with the build). Not part of `make test`; .ci/run may run it after.
VENV3 := .venv-pandas3
STAMP3 := $(VENV3)/.installed
PANDAS3_TESTS := tests/sdk/ingest tests/sdk/datasets tests/clinograph
$(STAMP3): pyproject.toml setup.py
	test -x $(VENV3)/bin/python || $(PY) -m venv $(VENV3)
	$(VENV3)/bin/pip install -q --no-compile torch==2.13.0 'uv>=0.5,<1'
	$(VENV3)/bin/uv pip install -q --python $(VENV3)/bin/python -e '.[all,test]' 'pandas>=3,<4'
	$(VENV3)/bin/python -c "import pandas, sys; sys.exit(pandas.__version__[0] != '3')"
	touch $(STAMP3)

test-pandas3: $(STAMP3)
	OMP_NUM_THREADS=1 $(VENV3)/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadscope -m "not slow" \
	  $(PANDAS3_TESTS) --basetemp=$$(mktemp -d /tmp/cgt.XXXXXX)

# ruff, then the import contracts in pyproject.toml (see tests/test_import_contracts.py).
lint: $(STAMP)
	$(BIN)/ruff check clinograph sdk secure research benchmarks tests examples
	$(BIN)/python tests/test_import_contracts.py

# Every study script under research/ with --quick (minutes each; JSON to research/<study>/results/
# <script>_quick.json); `make bench ARGS=--full` for the real runs (hours). research/README.md.
bench: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m research.run_all $(ARGS)

clean:
	rm -rf $(VENV) .venv-server $(VENV3) build *.egg-info runs
