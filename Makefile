# fedtail: `make demo` and `make test` are the two entry points; both bootstrap .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Local wheel folder of this machine kind (holds the CPU build of torch); harmless elsewhere.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PIP    := $(BIN)/python -m pip install --disable-pip-version-check -q $(FIND_LINKS)

.PHONY: demo test data install bench clean

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements.txt
	$(PIP) --no-deps --no-build-isolation -e .
	touch $(STAMP)

data: $(STAMP)
	PY=$(BIN)/python bash scripts/ensure-fmnist.sh

demo: data
	$(BIN)/fedtail compare --config configs/demo.toml --algorithms fedavg,local --out runs/demo

test: data
	$(BIN)/python -m pytest -o addopts="" -q

bench: data
	$(BIN)/python benchmarks/throughput.py

clean:
	rm -rf $(VENV) runs
