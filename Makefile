# fedtail: `make demo` and `make test` are the two entry points; both bootstrap .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Local wheel folder of this machine kind (holds the CPU build of torch); harmless elsewhere.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PIP    := $(BIN)/python -m pip install --disable-pip-version-check -q $(FIND_LINKS)

FLOWER := $(VENV)/.installed-flower
TRACKING := $(VENV)/.installed-tracking
DP := $(VENV)/.installed-dp

.PHONY: demo test test-flower data install install-flower install-tracking install-dp bench bench-gpu bench-flower bench-scaling cli-doc clean

install: $(STAMP)

# Flower (fedtail.flower) on top: `make test` needs it for the adapter tests, so CI installs it too.
install-flower: $(FLOWER)

$(FLOWER): $(STAMP) requirements-flower.txt
	$(PIP) -r requirements.txt -r requirements-flower.txt
	touch $(FLOWER)

# TensorBoard and MLflow (fedtail.tracking, --log tensorboard / mlflow) on top of Flower's pins (grpcio, protobuf,
# SQLAlchemy, alembic): `make test` reads their logs back.
install-tracking: $(TRACKING)

$(TRACKING): $(FLOWER) requirements-tracking.txt
	$(PIP) -r requirements.txt -r requirements-flower.txt -r requirements-tracking.txt
	touch $(TRACKING)

# Google's dp-accounting (fedtail.engine.guard, --dp-clip) on top: `make test` checks ε against it.
install-dp: $(DP)

$(DP): $(TRACKING) requirements-dp.txt
	$(PIP) -r requirements.txt -r requirements-flower.txt -r requirements-tracking.txt -r requirements-dp.txt
	touch $(DP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements.txt
	$(PIP) --no-deps --no-build-isolation -e .
	touch $(STAMP)

data: $(STAMP)
	PY=$(BIN)/python bash scripts/ensure-fmnist.sh

demo: data
	$(BIN)/fedtail compare --config configs/demo.toml --algorithms mupfl,ditto,fedavg,local --out runs/demo

# The suite in parallel (pytest-xdist): one process per core, at most 8.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 8 ] && n=8; echo $$n)

test: data install-flower install-tracking install-dp
	$(BIN)/python -m pytest -o addopts="" -q -n $(TEST_JOBS) --ignore=tests/deployment

# Loopback Flower deployments (SuperLink + SuperNodes on 127.0.0.1: TLS, node keys, a killed node).
test-flower: data install-flower
	$(BIN)/python -m pytest -o addopts="" -q tests/deployment

bench: data
	$(BIN)/python benchmarks/throughput.py

# On a machine with an NVIDIA GPU (benchmarks/gpu.py): the Python that holds your CUDA build of torch, with
# fedtail importable from src/ (not .venv, which holds the CPU build); Fashion-MNIST as `fedtail run` finds it.
bench-gpu:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) benchmarks/gpu.py --out gpu.json --markdown gpu.md

bench-flower: data install-flower
	$(BIN)/python benchmarks/flower_rounds.py

# Server work of the clustered methods at 10/100/1000 clients, peak memory of 1000-client rounds.
bench-scaling: install
	$(BIN)/python benchmarks/server_scaling.py

# docs/cli.md from the command line itself (tests/test_cli.py fails when it is stale).
cli-doc: $(STAMP)
	$(BIN)/python -m fedtail.cli.reference > docs/cli.md

clean:
	rm -rf $(VENV) runs
