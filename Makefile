# Two set-up commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: demo test test-slow stress lint env clean

# Create the environment and install legato. torch is pinned to the local CPU build first so
# that the `torch>=2.6` requirement is already met and pip never fetches a CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

env: $(STAMP)

demo: $(STAMP)
	$(BIN)/legato train

test: $(STAMP)
	$(BIN)/python -m pytest -q

# What `make test` leaves out (the `slow` marker, see pyproject.toml): the longest few.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# The multi-process tests of `make test` 5 times in a row, each time while a second copy of
# the same selection runs on the same cores: what `make test` must survive on a loaded machine.
stress: $(STAMP)
	@for i in 1 2 3 4 5; do \
	  log=$$(mktemp); \
	  $(BIN)/python -m pytest -q -m "distributed and not slow" -p no:cacheprovider > $$log 2>&1 & copy=$$!; \
	  $(BIN)/python -m pytest -q -m "distributed and not slow" -p no:cacheprovider; mine=$$?; \
	  wait $$copy; theirs=$$?; tail -n 3 $$log; rm -f $$log; \
	  echo "round $$i: this copy exit $$mine, the other copy exit $$theirs"; \
	  [ $$mine -eq 0 ] && [ $$theirs -eq 0 ] || exit 1; \
	done

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
