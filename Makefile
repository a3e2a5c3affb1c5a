# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The default environment holds the oldest jax/jaxlib/egglog pyproject.toml allows; `test-newest` the newest.
OLDEST := constraints/oldest.txt
# The newest jax needs Python >= 3.12. Through pyenv the `python3.12` shim needs PYENV_VERSION; elsewhere
# the variable is ignored. Override with e.g. `make test-newest PYTHON_NEWEST=/usr/bin/python3.12`.
PYTHON_NEWEST ?= env PYENV_VERSION=3.12.1 python3.12
VENV_NEWEST ?= .venv-newest
PY_NEWEST := $(VENV_NEWEST)/bin/python
STAMP_NEWEST := $(VENV_NEWEST)/.installed

.PHONY: demo test test-slow test-newest lint fixtures bench clean

$(STAMP): pyproject.toml $(OLDEST)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c $(OLDEST) -e '.[test,ray]'
	touch $(STAMP)

# Eager upgrade: whatever is newest today within pyproject.toml's ranges, even in an existing venv.
$(STAMP_NEWEST): pyproject.toml
	$(PYTHON_NEWEST) -m venv $(VENV_NEWEST)
	$(PY_NEWEST) -m pip install --quiet --upgrade pip
	$(PY_NEWEST) -m pip install --quiet --upgrade --upgrade-strategy eager -e '.[test]'
	touch $(STAMP_NEWEST)

demo: $(STAMP)
	@echo "== a correct Megatron MLP (GSPMD/Shardy partitioned HLO) =="
	@$(VENV)/bin/scalify-hlo diff tests/fixtures/megatron_mlp_shardy/before.mlir tests/fixtures/megatron_mlp_shardy/after.hlo; \
	  echo "(exit code $$?: 0 = equivalent)"
	@echo
	@echo "== a shard_map MLP that forgets its psum =="
	@$(VENV)/bin/scalify-hlo diff tests/fixtures/megatron_mlp_shard_map_missing_psum/before.mlir tests/fixtures/megatron_mlp_shard_map_missing_psum/after.mlir; \
	  echo "(exit code $$?: 1 = discrepancy)"

# Tests run on every core (pytest-xdist); a group that must share a process is marked xdist_group.
test: $(STAMP)
	$(PY) -m pytest -q -n auto --dist loadgroup

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow -n auto --dist loadgroup

# The suite on the newest jax/jaxlib/egglog (Python 3.12). A machine without Python 3.12 skips it (exit 0).
test-newest:
	@if ! $(PYTHON_NEWEST) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; then \
	  echo "test-newest skipped: no Python 3.12 ('$(PYTHON_NEWEST)' does not run Python 3.12; set PYTHON_NEWEST)"; \
	  exit 0; \
	fi; \
	$(MAKE) --no-print-directory $(STAMP_NEWEST) && \
	$(PY_NEWEST) -c 'import importlib.metadata as m; print("newest:", *(f"{p}=={m.version(p)}" for p in ("jax", "jaxlib", "egglog")))' && \
	$(PY_NEWEST) -m pytest -q -n auto --dist loadgroup

lint: $(STAMP)
	$(VENV)/bin/ruff check scalify_hlo parsers rules tools tests
	$(VENV)/bin/mypy scalify_hlo parsers rules

fixtures: $(STAMP)
	$(PY) tools/gen_fixtures.py

bench: $(STAMP)
	$(PY) tools/bench.py

clean:
	rm -rf $(VENV) $(VENV_NEWEST) build *.egg-info
