# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow lint fixtures bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	@echo "== a correct Megatron MLP (GSPMD/Shardy partitioned HLO) =="
	@$(VENV)/bin/scalify-hlo diff tests/fixtures/megatron_mlp_shardy/before.mlir tests/fixtures/megatron_mlp_shardy/after.hlo; \
	  echo "(exit code $$?: 0 = equivalent)"
	@echo
	@echo "== a shard_map MLP that forgets its psum =="
	@$(VENV)/bin/scalify-hlo diff tests/fixtures/megatron_mlp_shard_map_missing_psum/before.mlir tests/fixtures/megatron_mlp_shard_map_missing_psum/after.mlir; \
	  echo "(exit code $$?: 1 = discrepancy)"

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check scalify_hlo parsers rules tools tests
	$(VENV)/bin/mypy scalify_hlo parsers rules

fixtures: $(STAMP)
	$(PY) tools/gen_fixtures.py

bench: $(STAMP)
	$(PY) tools/bench.py

clean:
	rm -rf $(VENV) build *.egg-info
