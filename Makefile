# The two set-up commands of the README: `make serve` runs the server, `make test` runs the suite.
# Both install into a virtual environment ($(VENV)) exactly what requirements.lock pins (every
# package, hashed); pyproject.toml keeps the ranges for people installing the package elsewhere.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
UV := $(BIN)/uv
LOCK := requirements.lock
# torch's CPU build lies in this folder on machines of this kind (PyPI's torch is the CUDA build)
FIND_LINKS ?= /opt/wheels
COMPILE := $(UV) pip compile pyproject.toml --extra dev --generate-hashes --python-version 3.11 \
	--find-links $(FIND_LINKS) --emit-find-links --custom-compile-command "make lock"
PYTEST := -m pytest -q -p no:cacheprovider

.PHONY: install install-dev serve test lint lock lock-check test-latest

$(UV):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check "uv==$$(sed -n 's/^uv==\([^ ]*\).*/\1/p' $(LOCK))"

# exactly the lock: packages it does not list are removed, then the project itself (no deps)
install: $(UV)
	$(UV) pip sync -q --python $(BIN)/python --require-hashes $(LOCK)
	$(UV) pip install -q --python $(BIN)/python --no-deps -e .
	$(UV) pip check -q --python $(BIN)/python

# the tests also start a real redis-server and drive Debian's Chromium
install-dev: install
	bash scripts/ensure_redis.sh
	bash scripts/ensure_chromium.sh

serve: install
	$(BIN)/radixcache serve

test: install-dev
	$(BIN)/python $(PYTEST)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

lint:
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# refresh the lock to the newest releases pyproject allows, then run the suite on it; commit both
lock: $(UV)
	$(COMPILE) --upgrade -o $(LOCK)
	$(MAKE) test

# the lock still satisfies pyproject.toml (resolving again, preferring the locked versions, changes
# nothing): fails when a dependency was added or changed without `make lock`
lock-check: $(UV)
	cp $(LOCK) $(VENV)/lock-check.txt
	$(COMPILE) -q -o $(VENV)/lock-check.txt
	diff -u $(LOCK) $(VENV)/lock-check.txt

# not gating: the suite on the newest releases pyproject allows, in a venv of its own, so drift is
# seen before a `make lock` bites
test-latest:
	rm -rf .venv-latest
	$(MAKE) VENV=.venv-latest .venv-latest/bin/uv
	.venv-latest/bin/uv pip install -q --python .venv-latest/bin/python --upgrade \
		--find-links $(FIND_LINKS) -e '.[dev]'
	.venv-latest/bin/python $(PYTEST)
