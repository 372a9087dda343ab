# `make demo` and `make test` each set up .venv on their own; a second run only
# reinstalls when pyproject.toml changed.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean engine browser postgres screenshots bytecode

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,ui,kernels]'
	@touch $(STAMP)

install: $(STAMP)

# The real engine for the local backend and its tests: vLLM's CPU build in .venv-engine and the
# tiny-moe model it serves (executor/engine_env.sh and executor/tinymodel.py; both keep a stamp,
# so a second run returns at once).
ENGINE_VENV := .venv-engine

engine:
	@PYTHON=$(PYTHON) bash executor/engine_env.sh $(ENGINE_VENV)
	@$(ENGINE_VENV)/bin/python executor/tinymodel.py $(ENGINE_VENV)/models/tiny-moe

# The browser test and the README screenshots drive Debian's Chromium (never a downloaded one).
browser:
	@command -v chromium >/dev/null 2>&1 || { SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The PostgreSQL test starts a real server from Debian's package (its binaries live under
# /usr/lib/postgresql/<version>/bin, off PATH; the test looks there).
postgres:
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

screenshots: $(STAMP) browser
	$(BIN)/python -m app.screenshots

# Bytecode for the project's sources, written up front: a shell with PYTHONDONTWRITEBYTECODE set
# (as CI runners often are) would otherwise compile them again in every process a command or a
# test starts (about 0.3 s each); Python still reads what is written here.
SOURCES := planner simulator executor kernels app tests benchmarks

bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q $(SOURCES) >/dev/null

demo: $(STAMP) bytecode
	$(BIN)/rackplan search

# The suite on TEST_WORKERS processes: a file's tests stay on one worker, and every file that
# starts real engines on the same one (tests/conftest.py).
TEST_WORKERS ?= 2

test: $(STAMP) bytecode engine browser postgres
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) $(ENGINE_VENV)

# The router's image (Dockerfile.router), which `rackplan deploy --target kubernetes` runs in
# front of the engine pods; push it where the cluster pulls from and pass --router-image.
ROUTER_IMAGE ?= rackplan-router:0.1.0

.PHONY: router-image
router-image:
	docker build -f Dockerfile.router -t $(ROUTER_IMAGE) .
