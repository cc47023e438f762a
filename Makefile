# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo serve test check lint types fmt bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "LOTA needs Python 3.11+"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m bench.demo

# With nothing configured, serve an embedded local S3 origin; LOTA_CONFIG or LOTA_ORIGIN picks a
# real one. With LOTA_ORIGIN, clients sign with a key pair made once in $(CREDENTIALS).
CREDENTIALS ?= var/credentials.toml
serve: $(STAMP)
	@if [ -n "$$LOTA_CONFIG" ]; then $(BIN)/lota serve --config "$$LOTA_CONFIG"; \
	elif [ -n "$$LOTA_ORIGIN" ]; then \
	  creds="$${LOTA_AUTH_CREDENTIALS:-$(CREDENTIALS)}"; \
	  if [ -f "$$creds" ]; then echo "Clients sign with a key pair from $$creds"; \
	  else $(BIN)/lota credentials new "$$creds" || exit 2; fi; \
	  $(BIN)/lota serve --credentials "$$creds"; \
	else $(BIN)/lota serve --embedded-origin --cache-dir var/cache --cache-size 10GiB; fi

# Two pytest processes, each taking whole files (fixtures started per file stay with it).
TEST_PROCESSES ?= 2
test: $(STAMP)
	$(BIN)/python -m tests.setup_services
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_PROCESSES) --dist loadfile $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check lota tests bench
	$(BIN)/ruff format --check lota tests bench

types: $(STAMP)
	$(BIN)/mypy

check: lint types test

fmt: $(STAMP)
	$(BIN)/ruff format lota tests bench
	$(BIN)/ruff check --fix lota tests bench

bench: $(STAMP)
	$(BIN)/python -m bench.memory

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache
