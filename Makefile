# specialisation-zoo: `make demo`, `make test`, `make bench`. Each installs what it needs first
# (editable, into the active Python environment, only when this checkout is not already the
# installed one).
PYTHON ?= python3
HERE := $(abspath .)
# true when `import zoo` (from outside this folder) resolves to this checkout
INSTALLED = (cd / && $(PYTHON) -c "import sys, os, zoo; sys.exit(os.path.dirname(os.path.dirname(os.path.realpath(zoo.__file__))) != os.path.realpath('$(HERE)'))" 2>/dev/null)

.PHONY: demo test bench install install-dev

# --no-build-isolation: no download of build tools on machines without network (setuptools is
# installed first where the environment lacks it)
install:
	@$(INSTALLED) || { $(PYTHON) -c "import setuptools" 2>/dev/null || $(PYTHON) -m pip install "setuptools>=64"; \
	  $(PYTHON) -m pip install --no-build-isolation -e .; }

install-dev: install
	@$(PYTHON) -c "import pytest" 2>/dev/null || $(PYTHON) -m pip install -e ".[dev]" --no-build-isolation

demo: install
	$(PYTHON) -m zoo fit --config recipes/quickstart.yaml

test: install-dev
	$(PYTHON) -m pytest -q tests

bench: install
	@for b in bench/bench_*.py; do echo "== $$b"; $(PYTHON) $$b || exit 1; done
