# Two commands for a fresh machine:  make demo  ·  make test
# Both create .venv on first use. The package itself accepts any supported torch (pyproject.toml's [torch]
# extra); the dev environment pins torch 2.13.0 here, installed before trainmem so that the open range finds it
# satisfied (on this machine pip takes the 2.13.0 CPU build from its local wheels; without a torch already
# there, an open range would pull a multi-GB CUDA build). make test also creates .venv-vision (torch 2.14.1
# + torchvision + timm) for the tests of torchvision:/timm: references and of the install into another torch.
# Stamp files record each step, so `make demo` then `make test` installs each thing once.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEV_TORCH := torch==2.13.0

# Before an environment is created: refuse in one line when the disk cannot hold it (pip would fail half-way,
# leaving a broken environment). Sizes measured here: .venv with the test extras 2.8 GB, .venv-vision 5.8 GB
# (torch 2.14.1 is a CUDA build with its nvidia-* wheels), plus what pip unpacks on the way.
define need_free_gb
	@free_kb=$$(df -Pk . | awk 'NR==2 {print $$4}'); \
	if [ "$$free_kb" -lt $$(( $(1) * 1024 * 1024 )) ]; then \
	  echo "make: $(2) needs about $(1) GB free on this disk; $$(( free_kb / 1024 / 1024 )) GB are free (df -h .)" >&2; exit 2; fi
endef

# torch alone, first: every later pip command in .venv names the pin again, so none of them can move it
$(VENV)/.torch-ready:
	$(call need_free_gb,4,$(VENV) (torch $(DEV_TORCH:torch==%=%), TensorFlow and the test extras))
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(DEV_TORCH)
	touch $@

# what the demo needs: trainmem with its [torch] extra, torch (already there), and numpy: torch's wheel does not
# require it, but without it every import of torch warns "Failed to initialize NumPy" (torch/csrc/utils/tensor_numpy.cpp)
$(VENV)/.demo-ready: $(VENV)/.torch-ready pyproject.toml
	$(BIN)/pip install --quiet -e '.[torch]' $(DEV_TORCH) numpy
	touch $@

# the test extras (pytest, pyyaml, transformers, peft, onnx, tensorflow-cpu, keras) on top
$(VENV)/.test-ready: $(VENV)/.demo-ready pyproject.toml
	$(BIN)/pip install --quiet -e '.[test]' $(DEV_TORCH)
	touch $@

# torchvision and timm need torch 2.14.1 (a CUDA build that runs on the CPU), not the dev pin: their tests
# run in a second environment. trainmem goes in as a user installs it, with its dependencies, into an
# environment that already has a supported torch: tests/test_install.py checks that torch stays.
VISION := .venv-vision
VISION_PACKAGES := torch==2.14.1 torchvision==0.29.1 timm==1.0.31 accelerate==1.16.0 peft==0.21.2 transformers==5.24.0 onnx==1.23.2 pytest pytest-xdist==3.8.0 pyyaml

$(VISION)/.ready: pyproject.toml
	$(call need_free_gb,7,$(VISION) (torch 2.14.1 with CUDA wheels and torchvision))
	$(PYTHON) -m venv $(VISION)
	$(VISION)/bin/pip install --quiet $(VISION_PACKAGES)
	$(VISION)/bin/pip install --quiet -e '.[torch]'
	touch $@

# Debian's chromium opens the HTML report headless in tests/test_report_html.py (the page is drawn, makes no
# network request); installed once, when it is missing, from Debian's archive
CHROMIUM_READY := .chromium-ready
$(CHROMIUM_READY):
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }
	touch $@

.PHONY: demo test check lint bench accuracy-gpu coverage compat docs
demo: $(VENV)/.demo-ready
	$(BIN)/trainmem estimate mlp:1000-100-100-100-100-10 --input-shape 1000 --batch-size 256 --optimizer adam

# the suite on two workers (pytest-xdist), each test file whole on one worker (its module fixtures run once):
# 10 min 57 s on a fresh clone of this 2-core machine, where one worker took 18 min 28 s to 19 min 6 s in the last
# session's fresh clones (many tests run real training in child processes, so one worker already kept more than one
# core busy; machine speed varies between sessions); TEST_WORKERS=0 runs it in this process. The torchvision/timm
# tests run on two workers too, test by test: 3 min 19 s here on 2026-12-06, where one worker took 4.5 to 5 min
TEST_WORKERS ?= 2
test: $(VENV)/.test-ready $(VISION)/.ready $(CHROMIUM_READY) lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile
	$(VISION)/bin/python -m pytest -n $(TEST_WORKERS) --dist load tests/test_vision.py tests/test_install.py

# the development loop: the fast tests only (no real measured runs, no Keras/TensorFlow, none of the tests that
# take two seconds or more: markers in pyproject.toml), stopping at the first failure; make test runs everything
check: $(VENV)/.test-ready lint
	$(BIN)/python -m pytest -m "not slow and not tf and not heavy" -x -n $(TEST_WORKERS) --dist loadfile

# ruff with pyproject.toml's rules (make test runs it first)
lint: $(VENV)/.test-ready
	$(BIN)/ruff check src tests benchmarks

# the documentation site: docs/*.md with mkdocs.yml's nav, MkDocs with the Material theme (pyproject.toml's [docs]
# extra), built into site/; --strict turns every warning (a link to a missing page or anchor) into a failure. Needs
# only the environment, not torch: .venv is created here when missing
$(VENV)/.docs-ready: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[docs]'
	touch $@

docs: $(VENV)/.docs-ready
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# LitGPT's own model code for the LitGPT rows of benchmarks/accuracy_gpu.py (benchmarks/litgpt_models.py): litgpt
# 0.4.13 without its dependencies, which would move torch and lightning (what its model code imports is there)
$(VENV)/.litgpt-ready: $(VENV)/.test-ready
	$(BIN)/pip install --quiet --no-deps litgpt==0.4.13
	touch $@

accuracy-gpu: $(VENV)/.litgpt-ready
	$(BIN)/python benchmarks/accuracy_gpu.py

bench: $(VENV)/.test-ready
	$(BIN)/python benchmarks/accuracy_cpu.py
	$(BIN)/python benchmarks/speed.py

coverage: $(VENV)/.test-ready $(VISION)/.ready
	$(VISION)/bin/python benchmarks/coverage.py
	$(VISION)/bin/python benchmarks/onnx_coverage.py

# The supported torch releases (pyproject.toml's range: the oldest, the newest and every second minor between),
# each in its own environment .venv-compat-<version> with trainmem installed normally: benchmarks/compat.py
# runs there every feature's command line (estimate, fit, compare, each --strategy, plan, hf:, LoRA, Keras on
# torch, measure), the core tests and the calibration estimates, and writes the features × torch matrix and the
# comparison with the dev pin's estimates to benchmarks/results/compat.md; it fails when a feature failed.
# pip on this machine caps torch below the newest release with a constraint file; an empty constraint file for
# these commands lifts the cap (also for the tests: tests/test_install.py asks pip what it would install).
# Each environment downloads a CUDA build of torch (5-7 GB installed, 2-6 min each here).
COMPAT_OLDEST := 2.6.0
COMPAT_NEWEST := 2.15.0
COMPAT_VERSIONS := $(COMPAT_OLDEST) 2.8.0 2.10.0 2.12.1 $(COMPAT_NEWEST)
# pinned, the versions the dev environment uses, which install next to every one: transformers builds the BERT
# rows; pytest, pyyaml, peft and onnx let the core tests run; keras (no TensorFlow) runs Keras on the torch
# backend (torchvision is left out: its wheels pair with one torch)
COMPAT_PACKAGES := pytest==9.2.0 pyyaml==6.0.4 transformers==5.24.0 peft==0.21.2 onnx==1.23.2 keras==3.15.1
COMPAT_OUT := build/compat

.venv-compat-%/.ready: pyproject.toml
	$(PYTHON) -m venv .venv-compat-$*
	PIP_CONSTRAINT=/dev/null .venv-compat-$*/bin/pip install --quiet torch==$* $(COMPAT_PACKAGES)
	PIP_CONSTRAINT=/dev/null .venv-compat-$*/bin/pip install --quiet -e '.[torch]' torch==$*
	touch $@

compat: $(VENV)/.test-ready $(foreach version,$(COMPAT_VERSIONS),.venv-compat-$(version)/.ready)
	mkdir -p $(COMPAT_OUT)
	$(BIN)/python benchmarks/compat.py run --no-tests --out $(COMPAT_OUT)/baseline.json
	$(BIN)/python benchmarks/compat.py features --out $(COMPAT_OUT)/baseline.features.json
	$(foreach version,$(COMPAT_VERSIONS),PIP_CONSTRAINT=/dev/null .venv-compat-$(version)/bin/python benchmarks/compat.py features --out $(COMPAT_OUT)/$(version).features.json &&) true
	$(foreach version,$(COMPAT_VERSIONS),PIP_CONSTRAINT=/dev/null .venv-compat-$(version)/bin/python benchmarks/compat.py run --out $(COMPAT_OUT)/$(version).json &&) true
	$(BIN)/python benchmarks/compat.py report --baseline $(COMPAT_OUT)/baseline.json $(foreach version,$(COMPAT_VERSIONS),$(COMPAT_OUT)/$(version).json) --features $(COMPAT_OUT)/baseline.features.json $(foreach version,$(COMPAT_VERSIONS),$(COMPAT_OUT)/$(version).features.json)
