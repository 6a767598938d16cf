# Two entry points: `make run` plans the built-in default, `make test` runs the suite.
# Both create .venv on first use and install the pinned dependencies into it.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,torch,mlir]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/apportion demo

test: $(STAMP)
	$(VENV)/bin/ruff check apportion tests
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -n 2 -p no:cacheprovider

bench: $(STAMP)
	$(VENV)/bin/apportion bench workdiv
	$(VENV)/bin/apportion bench tiling

clean:
	rm -rf $(VENV) build *.egg-info
