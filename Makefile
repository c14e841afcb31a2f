# Everything a developer or CI runs goes through here: `make setup`, `make test` (and its slower
# tiers), `make rehearsal`, `make check`. Each target sets the environment up first when needed.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
CHECKOV_VENV := .venv-checkov
# TensorFlow 2.15.1 (the last release Horovod 0.28.1 builds against) has wheels for 3.9 to 3.11,
# and aws-cdk-lib 2.275 requires 3.10 or later (its Requires-Python on PyPI): 3.10 or 3.11.
PYTHON ?= python3
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/node_modules/.bin:$(PATH)
# Python writes each module's bytecode once (__pycache__/, ignored by git) and every later process
# reads it. Container images often set PYTHONDONTWRITEBYTECODE, and then each of the hundreds of
# Python processes the tests start compiles the project's modules again: make test took 428 s to
# 448 s with it, 408 s without (docs/test-tiers.md).
unexport PYTHONDONTWRITEBYTECODE

TF_VERSION := 2.15.1
HOROVOD_VERSION := 0.28.1
# Horovod compiles against the installed TensorFlow (about 5 minutes on 2 cores), so its wheel is
# kept outside the checkout and keyed by both versions: a fresh clone on the same machine reuses it.
WHEEL_CACHE ?= $(HOME)/.cache/horovod-fleet/wheels/horovod-$(HOROVOD_VERSION)-tf-$(TF_VERSION)
HOROVOD_BUILD_NOTE := building the Horovod $(HOROVOD_VERSION) wheel against TensorFlow $(TF_VERSION) (about 5 minutes, once per machine)
HOROVOD_BUILD_ENV := HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2

.PHONY: help setup test test-slow test-e2e test-all rehearsal check check-templates \
	check-templates-spot check-templates-drill fix synth bench-input bench-preprocess image-lock clean

help:
	@echo "make setup            create .venv (Python deps + cached Horovod wheel), node_modules (pinned CDK CLI) and .venv-checkov"
	@echo "make rehearsal        the whole run offline: local S3, preprocessing, 2 simulated nodes train over Horovod"
	@echo "make test             the default tier: every test that trains nothing (about 5 minutes, its bound)"
	@echo "make test-slow        training runs, Horovod ranks and benchmarks (about 15 minutes on 2 cores)"
	@echo "make test-e2e         the rehearsals, and as root the fault rehearsal"
	@echo "make test-all         all three tiers"
	@echo "make check            ruff lint + format check, shellcheck, cdk synth + cfn-lint + checkov"
	@echo "make synth            cdk synth with the defaults in cdk.json"
	@echo "make bench-preprocess preprocessing images/s per core against the TensorFlow reference"
	@echo "make bench-input      the trainer's input pipeline alone, images/s per core"
	@echo "make image-lock       resolve the training image's venv into bootstrap/image/requirements.lock"

# The three installs share nothing, so they run side by side: with checkov's venv made here too,
# a fresh clone's setup took the same 155 s as without it (docs/test-tiers.md).
SETUP_READY := $(VENV)/.ready node_modules/.ready $(CHECKOV_VENV)/.ready
setup:
	@$(MAKE) --question $(SETUP_READY) 2>/dev/null || \
		$(MAKE) --no-print-directory --output-sync=line -j3 $(SETUP_READY)

$(VENV)/.ready: requirements.txt requirements-dev.txt trainer/requirements.txt bootstrap/requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 10) <= v <= (3, 11) else "error: $(PYTHON) is Python %d.%d; the app needs 3.10 or 3.11 (TensorFlow 2.15.1 has no wheels past 3.11, aws-cdk-lib 2.275 none before 3.10): run make PYTHON=python3.11 ..." % v)'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip wheel setuptools
	$(PY) -m pip install --quiet -r requirements-dev.txt
	@# Its own line: make setup prints a line's output once the line has ended (--output-sync).
	@ls $(WHEEL_CACHE)/horovod-$(HOROVOD_VERSION)-*.whl >/dev/null 2>&1 || echo "$(HOROVOD_BUILD_NOTE)"
	@if ! ls $(WHEEL_CACHE)/horovod-$(HOROVOD_VERSION)-*.whl >/dev/null 2>&1; then \
		mkdir -p $(WHEEL_CACHE) && \
		$(HOROVOD_BUILD_ENV) $(PY) -m pip wheel --quiet --no-build-isolation --no-deps \
			--wheel-dir $(WHEEL_CACHE) horovod==$(HOROVOD_VERSION); \
	fi
	$(PY) -m pip install --quiet --no-index --find-links $(WHEEL_CACHE) horovod==$(HOROVOD_VERSION)
	$(PY) -c "import horovod.tensorflow as hvd; assert hvd.gloo_built(), 'Horovod was built without Gloo'"
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .   # .venv/bin/horovod-fleet
	touch $@

# The pinned Node.js LTS comes with the CDK CLI (package.json): node_modules/.bin is first on PATH,
# so cdk, and jsii under the Python app, run on it whatever Node ran npm.
NODE_MAJOR_MIN := 22
node_modules/.ready: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@node -e 'const v = +process.versions.node.split(".")[0]; if (v < $(NODE_MAJOR_MIN)) { console.error(`error: node_modules/.bin/node is Node.js $${process.versions.node}; the CDK runs on $(NODE_MAJOR_MIN) or later (an LTS): run npm ci again`); process.exit(1) }'
	touch $@

# The tiers (tests/conftest.py): the default one guards itself against training and rehearsals,
# and gives each test TEST_TIMEOUT_S, so that a slow test fails instead of slowing the suite.
PYTEST := TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest
TEST_TIMEOUT_S := 120
# A worker per core, at most 4: each imports TensorFlow and starts jsii once.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))
test: setup
	$(PYTEST) -m "not slow and not e2e" --timeout=$(TEST_TIMEOUT_S) -n $(TEST_WORKERS) --dist loadfile

# The slow tier's files that start several Horovod ranks run one after the other on one worker,
# and the rest (syntheses, single processes: a quarter of the 2 cores idle when the tier ran
# serially) beside them on the others (tests/conftest.py RANKS_FILES).
test-slow: setup
	$(PYTEST) -m slow -n $(TEST_WORKERS) --dist loadfile

# The fault rehearsal needs root (network namespaces, one per simulated host; docs/rehearsal.md).
# FAULT_ROWS=ci runs CI's subset of its rows (docs/rehearsal.md says which).
FAULT_ROWS ?= all
test-e2e: setup
	$(PYTEST) -m e2e tests/rehearsal
	@if [[ $$(id -u) -eq 0 ]]; then \
		$(PY) -m rehearsal --faults --rows $(FAULT_ROWS) --workdir "$${TMPDIR:-/tmp}/horovod-fleet-faults"; \
	else echo "make test-e2e: the fault rehearsal needs root (network namespaces): not run"; fi

test-all: test test-slow test-e2e

rehearsal: setup
	$(PY) -m rehearsal

$(CHECKOV_VENV)/.ready: requirements-checkov.txt
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet -r requirements-checkov.txt
	touch $@

# checkov fails on any finding without a reason; the reasons are in the templates' Metadata
# (stacks/nag.py). --skip-download: no Prisma Cloud account, and CI may be offline.
check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/shellcheck bootstrap/*.sh bootstrap/head/*.sh bootstrap/node/*.sh bootstrap/preprocess/*.sh bootstrap/image/*.sh bootstrap/image_proof/*.sh .ci/run
	@$(MAKE) --no-print-directory --output-sync=target -j$(TEST_WORKERS) check-templates \
		check-templates-spot check-templates-drill

# Each configuration's templates: synthesized (cdk-nag fails on a finding), cfn-lint, checkov. The
# three write their own cdk.out* and run side by side under make check: each alone leaves a core
# mostly idle (Node.js and Python take turns).
check-templates: setup
	npx cdk synth --quiet
	$(VENV)/bin/cfn-lint cdk.out/*.template.json
	$(CHECKOV_VENV)/bin/checkov --directory cdk.out --framework cloudformation --quiet --compact --skip-download

# The Spot fleet's templates differ in their launch templates: checked on their own.
check-templates-spot: setup
	npx cdk synth --quiet -c market=spot --output cdk.out.spot
	$(VENV)/bin/cfn-lint cdk.out.spot/TrainStack.template.json
	$(CHECKOV_VENV)/bin/checkov --file cdk.out.spot/TrainStack.template.json --framework cloudformation --quiet --compact --skip-download

# A drill's (-c drill=true) differ in TrainStack's FIS templates and roles, PreprocessStack's
# dataset and TeardownStack's exports: checked on their own.
check-templates-drill: setup
	npx cdk synth --quiet -c drill=true --output cdk.out.drill
	$(VENV)/bin/cfn-lint cdk.out.drill/*.template.json
	$(CHECKOV_VENV)/bin/checkov --directory cdk.out.drill --framework cloudformation --quiet --compact --skip-download

fix: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

synth: setup
	npx cdk synth

bench-preprocess: setup
	$(PY) -m trainer.preprocess.bench

bench-input: setup
	$(PY) -m trainer.bench_input --generate

# The training image's venv runs Python 3.10 on Ubuntu 22.04 x86_64: resolved for that target
# from PyPI's metadata (nothing is installed), written with its header kept.
IMAGE_LOCK := bootstrap/image/requirements.lock
image-lock: setup
	$(PY) -m pip install --quiet --dry-run --ignore-installed --report /tmp/image-lock.json \
		--python-version 3.11 --implementation cp --only-binary=:all: --target /tmp/image-lock \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
		--platform manylinux_2_27_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
		--platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 \
		--platform manylinux_2_39_x86_64 \
		-r bootstrap/image/image-requirements.in
	{ grep '^#' $(IMAGE_LOCK); $(PY) -c "import json; r = json.load(open('/tmp/image-lock.json')); \
		print('\n'.join(sorted('%s==%s' % (i['metadata']['name'].lower(), i['metadata']['version']) \
		for i in r['install'])))"; } > $(IMAGE_LOCK).new && mv $(IMAGE_LOCK).new $(IMAGE_LOCK)

clean:
	rm -rf cdk.out cdk.out.spot cdk.out.drill .pytest_cache
