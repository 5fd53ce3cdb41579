# specialisation-zoo: `make demo`, `make test`, `make bench`. Each installs what it needs first
# (editable, into the active Python environment, only when this checkout is not already the
# installed one).
PYTHON ?= python3
HERE := $(abspath .)
# true when `import zoo` (from outside this folder) resolves to this checkout
INSTALLED = (cd / && $(PYTHON) -c "import sys, os, zoo; sys.exit(os.path.dirname(os.path.dirname(os.path.realpath(zoo.__file__))) != os.path.realpath('$(HERE)'))" 2>/dev/null)

.PHONY: demo test bench install install-dev

# --no-build-isolation: no download of build tools on machines without network. setuptools is
# installed first where the environment lacks it or has one older than 70.1, which cannot build
# an editable wheel without the separate `wheel` package (Python 3.11's bundled 65.5 cannot).
SETUPTOOLS_OK = $(PYTHON) -c "import sys, setuptools; sys.exit(tuple(int(v) for v in setuptools.__version__.split('.')[:2]) < (70, 1))" 2>/dev/null
install:
	@$(INSTALLED) || { $(SETUPTOOLS_OK) || $(PYTHON) -m pip install "setuptools>=70.1"; \
	  $(PYTHON) -m pip install --no-build-isolation -e .; }

# the dev extra: pytest, the docs tools and every optional part (h5py, scikit-learn: their tests)
install-dev: install
	@$(PYTHON) -c "import pytest, xdist, mkdocs, material, mkdocstrings_handlers.python, h5py, sklearn" 2>/dev/null || $(PYTHON) -m pip install -e ".[dev]" --no-build-isolation

demo: install
	$(PYTHON) -m zoo fit --config recipes/quickstart.yaml

# pytest-xdist: one worker per core, a file's tests on one worker (module fixtures start subprocess runs);
# the quick tier: make test PYTEST_ARGS='-m "not slow"'
test: install-dev
	$(PYTHON) -m pytest -n auto --dist loadfile -q $(PYTEST_ARGS)

# each bench prints its table and appends its rows to $BENCH_SUMMARY; the summary table ends the output
bench: install
	@rows=$$(mktemp); for b in bench/bench_*.py; do echo "== $$b"; BENCH_SUMMARY=$$rows $(PYTHON) $$b || exit 1; done; \
	  $(PYTHON) bench/summary.py $$rows; rm -f $$rows
