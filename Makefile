# The two set-up commands of the README: `make serve` runs the server, `make test` runs the suite.
PYTHON ?= python3

.PHONY: install install-dev serve test lint bench

install:
	$(PYTHON) -m pip install -q -e .

install-dev:
	$(PYTHON) -m pip install -q -e '.[dev]'
	bash scripts/ensure_redis.sh
	bash scripts/ensure_chromium.sh

serve: install
	radixcache serve

test: install-dev
	$(PYTHON) -m pytest -q -p no:cacheprovider
	ruff check .
	ruff format --check .

lint:
	ruff check . && ruff format --check .
