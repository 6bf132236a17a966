# Two commands for a fresh machine:  make demo  ·  make test
# Both create .venv on first use (torch 2.13.0, the CPU build, pinned in pyproject.toml).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/trainmem: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

.PHONY: demo test bench
demo: $(BIN)/trainmem
	$(BIN)/trainmem estimate mlp:1000-100-100-100-100-10 --input-shape 1000 --batch-size 256 --optimizer adam

test: $(BIN)/trainmem
	$(BIN)/python -m pytest

bench: $(BIN)/trainmem
	$(BIN)/python benchmarks/accuracy_cpu.py
	$(BIN)/python benchmarks/speed.py
