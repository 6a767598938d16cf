# Two entry points: `make run` plans the built-in default, `make test` runs the default suite
# (under 10 minutes on a quiet 2-core machine); `make test-all` adds the slow, multi-process and
# GPU tests. Each creates .venv on first use and installs the pinned dependencies into it.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test test-all lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,torch,mlir]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/apportion demo

# the default suite leaves out tests marked slow, distributed (torch.distributed processes) or gpu
DEFAULT_TESTS := -m "not slow and not distributed and not gpu"

lint: $(STAMP)
	$(VENV)/bin/ruff check apportion tests tools
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest -q -n 2 -p no:cacheprovider --durations=15 $(DEFAULT_TESTS)

# everything, slow, multi-process and GPU tests included (GPU tests skip without a GPU)
test-all: lint
	$(PY) -m pytest -q -n 2 -p no:cacheprovider

bench: $(STAMP)
	$(VENV)/bin/apportion bench workdiv
	$(VENV)/bin/apportion bench tiling

clean:
	rm -rf $(VENV) build *.egg-info
