# The two commands of README.md: `make run` and `make test`.  Each installs
# what is missing first: SBCL and Swank from Debian, and a venv with cl-mcp.

VENV := .venv
PYTHON ?= python3
DEBIAN_PACKAGES := sbcl cl-swank cl-alexandria
SWANK_LOADER := /usr/share/common-lisp/source/slime/swank-loader.lisp
ALEXANDRIA := /usr/share/common-lisp/source/alexandria/alexandria.asd
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test setup lisp venv clean

run: setup
	@exec $(VENV)/bin/cl-mcp

test: setup
	$(VENV)/bin/python -m pytest

setup: lisp venv

lisp:
	@if ! command -v sbcl >/dev/null || [ ! -f $(SWANK_LOADER) ] || [ ! -f $(ALEXANDRIA) ]; then \
	  echo "Installing $(DEBIAN_PACKAGES) from Debian" >&2; \
	  $(SUDO) apt-get update >&2 && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y $(DEBIAN_PACKAGES) >&2; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@[ -x $(VENV)/bin/python ] || $(PYTHON) -m venv $(VENV) >&2
	@$(VENV)/bin/python -m pip install --quiet --upgrade pip >&2
	@$(VENV)/bin/python -m pip install --quiet -e '.[test]' >&2
	@touch $@

clean:
	rm -rf $(VENV) .pytest_cache
