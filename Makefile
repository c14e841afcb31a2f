# Everything a developer or CI runs goes through here: `make setup`, `make test`,
# `make rehearsal`, `make check`. Each target sets the environment up first when needed.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
CHECKOV_VENV := .venv-checkov
# TensorFlow 2.15.1 (the last release Horovod 0.28.1 builds against) has wheels for 3.9 to 3.11.
PYTHON ?= python3
PY := $(VENV)/bin/python
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/node_modules/.bin:$(PATH)

TF_VERSION := 2.15.1
HOROVOD_VERSION := 0.28.1
# Horovod compiles against the installed TensorFlow (about 5 minutes on 2 cores), so its wheel is
# kept outside the checkout and keyed by both versions: a fresh clone on the same machine reuses it.
WHEEL_CACHE ?= $(HOME)/.cache/horovod-fleet/wheels/horovod-$(HOROVOD_VERSION)-tf-$(TF_VERSION)
HOROVOD_BUILD_ENV := HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2

.PHONY: help setup test rehearsal check fix synth bench-input bench-preprocess image-lock clean

help:
	@echo "make setup            create .venv (Python deps + cached Horovod wheel) and node_modules (pinned CDK CLI)"
	@echo "make rehearsal        the whole run offline: local S3, preprocessing, 2 simulated nodes train over Horovod"
	@echo "make test             every test (runs setup first when needed)"
	@echo "make check            ruff lint + format check, shellcheck, cdk synth + cfn-lint + checkov"
	@echo "make synth            cdk synth with the defaults in cdk.json"
	@echo "make bench-preprocess preprocessing images/s per core against the TensorFlow reference"
	@echo "make bench-input      the trainer's input pipeline alone, images/s per core"
	@echo "make image-lock       resolve the training image's venv into bootstrap/image/requirements.lock"

setup: $(VENV)/.ready node_modules/.ready

$(VENV)/.ready: requirements.txt requirements-dev.txt trainer/requirements.txt bootstrap/requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 9) <= v <= (3, 11) else "error: $(PYTHON) is Python %d.%d; TensorFlow 2.15.1 needs 3.9 to 3.11: run make PYTHON=python3.11 ..." % v)'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip wheel setuptools
	$(PY) -m pip install --quiet -r requirements-dev.txt
	@if ! ls $(WHEEL_CACHE)/horovod-$(HOROVOD_VERSION)-*.whl >/dev/null 2>&1; then \
		echo "building the Horovod $(HOROVOD_VERSION) wheel against TensorFlow $(TF_VERSION) (about 5 minutes, once per machine)"; \
		mkdir -p $(WHEEL_CACHE) && \
		$(HOROVOD_BUILD_ENV) $(PY) -m pip wheel --quiet --no-build-isolation --no-deps \
			--wheel-dir $(WHEEL_CACHE) horovod==$(HOROVOD_VERSION); \
	fi
	$(PY) -m pip install --quiet --no-index --find-links $(WHEEL_CACHE) horovod==$(HOROVOD_VERSION)
	$(PY) -c "import horovod.tensorflow as hvd; assert hvd.gloo_built(), 'Horovod was built without Gloo'"
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .   # .venv/bin/horovod-fleet
	touch $@

node_modules/.ready: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

test: setup
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest

rehearsal: setup
	$(PY) -m rehearsal

$(CHECKOV_VENV)/.ready: requirements-checkov.txt
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet -r requirements-checkov.txt
	touch $@

# checkov fails on any finding without a reason; the reasons are in the templates' Metadata
# (stacks/nag.py). --skip-download: no Prisma Cloud account, and CI may be offline.
check: setup $(CHECKOV_VENV)/.ready
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/shellcheck bootstrap/*.sh bootstrap/image/*.sh bootstrap/image_proof/*.sh .ci/run
	npx cdk synth --quiet
	$(VENV)/bin/cfn-lint cdk.out/*.template.json
	$(CHECKOV_VENV)/bin/checkov --directory cdk.out --framework cloudformation --quiet --compact --skip-download
	# The Spot fleet's templates differ in their launch templates: checked on their own.
	npx cdk synth --quiet -c market=spot --output cdk.out.spot
	$(VENV)/bin/cfn-lint cdk.out.spot/TrainStack.template.json
	$(CHECKOV_VENV)/bin/checkov --file cdk.out.spot/TrainStack.template.json --framework cloudformation --quiet --compact --skip-download

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
		--python-version 3.10 --implementation cp --only-binary=:all: --target /tmp/image-lock \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
		--platform manylinux_2_27_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
		-r bootstrap/image/image-requirements.in
	{ grep '^#' $(IMAGE_LOCK); $(PY) -c "import json; r = json.load(open('/tmp/image-lock.json')); \
		print('\n'.join(sorted('%s==%s' % (i['metadata']['name'].lower(), i['metadata']['version']) \
		for i in r['install'])))"; } > $(IMAGE_LOCK).new && mv $(IMAGE_LOCK).new $(IMAGE_LOCK)

clean:
	rm -rf cdk.out .pytest_cache
