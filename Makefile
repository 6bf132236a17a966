# Two commands for a fresh machine:  make demo  ·  make test
# Both create .venv on first use (torch 2.13.0, the CPU build, pinned in pyproject.toml); make test also
# creates .venv-vision (torch 2.14.1 + torchvision + timm) for the tests of torchvision:/timm: references.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/trainmem: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# torchvision and timm need torch 2.14.1 (a CUDA build that runs on the CPU), not the pinned CPU build:
# their tests run in a second environment; trainmem itself is installed there without its pin.
VISION := .venv-vision
VISION_PACKAGES := torch==2.14.1 torchvision==0.29.1 timm==1.0.31 accelerate==1.16.0 peft==0.21.2 transformers==5.24.0 onnx==1.23.2 pytest pyyaml

$(VISION)/.ready: pyproject.toml
	$(PYTHON) -m venv $(VISION)
	$(VISION)/bin/pip install --quiet $(VISION_PACKAGES)
	$(VISION)/bin/pip install --quiet --no-deps -e .
	touch $@

.PHONY: demo test bench coverage
demo: $(BIN)/trainmem
	$(BIN)/trainmem estimate mlp:1000-100-100-100-100-10 --input-shape 1000 --batch-size 256 --optimizer adam

test: $(BIN)/trainmem $(VISION)/.ready
	$(BIN)/python -m pytest
	$(VISION)/bin/python -m pytest tests/test_vision.py

bench: $(BIN)/trainmem
	$(BIN)/python benchmarks/accuracy_cpu.py
	$(BIN)/python benchmarks/speed.py

coverage: $(BIN)/trainmem $(VISION)/.ready
	$(VISION)/bin/python benchmarks/coverage.py
	$(VISION)/bin/python benchmarks/onnx_coverage.py
