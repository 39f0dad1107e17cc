# The two commands of README.md: `make run` and `make test`.  Each installs
# what is missing first: SBCL and Swank from Debian (plus, for the tests,
# Alexandria, cl-ppcre, split-sequence, FiveAM, RT, Fiasco, Emacs and SLIME,
# and the truth harness's corpus; for `make bench`, yason), and a venv with cl-mcp.

VENV := .venv
PYTHON ?= python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SWANK_LOADER := /usr/share/common-lisp/source/slime/swank-loader.lisp
ALEXANDRIA := /usr/share/common-lisp/source/alexandria/alexandria.asd
CL_PPCRE := /usr/share/common-lisp/source/cl-ppcre/cl-ppcre.asd
SPLIT_SEQUENCE := /usr/share/common-lisp/source/cl-split-sequence/split-sequence.asd
YASON := /usr/share/common-lisp/source/yason/yason.asd
FIVEAM := /usr/share/common-lisp/source/fiveam/fiveam.asd
RT := /usr/share/common-lisp/source/rt/rt.asd
FIASCO := /usr/share/common-lisp/source/fiasco/fiasco.asd
SLIME_EL := /usr/share/emacs/site-lisp/elpa-src/slime-*/slime.el
# The truth harness's corpus (tests/truth/corpus.py), beside the libraries above
CORPUS_PACKAGES := cl-esrap cl-iterate cl-lparallel cl-bordeaux-threads cl-named-readtables cl-flexi-streams cl-babel cl-who cl-containers cl-unicode cl-cffi
CORPUS_ASDS := esrap/esrap.asd iterate/iterate.asd lparallel/lparallel.asd bordeaux-threads/bordeaux-threads.asd named-readtables/named-readtables.asd cl-flexi-streams/flexi-streams.asd babel/babel.asd cl-who/cl-who.asd cl-containers/cl-containers.asd cl-unicode/cl-unicode.asd cl-cffi/cffi.asd

.PHONY: run test bench profile setup lisp test-lisp bench-lisp venv clean interop truth soak

run: lisp venv
	@exec $(VENV)/bin/cl-mcp

# The suite in TEST_WORKERS processes (pytest-xdist; each test file stays in
# one, with its own cache directory), the 25 slowest tests listed at the end.
# Compiled first: the environment may forbid writing bytecode
# (PYTHONDONTWRITEBYTECODE), and every test starts cl-mcp anew.
TEST_WORKERS ?= 4
test: test-lisp venv
	@$(VENV)/bin/python -m compileall -q cl_mcp tests >/dev/null
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25

# Every answer of the truth harness over its whole corpus: docs/truth.md
truth: test-lisp venv
	$(VENV)/bin/python -m tests.truth.run

# The long chaos soak, both modes (docs/attach.md, "The chaos soak")
SOAK_ROUNDS ?= 60
SOAK_SEED ?= 36
soak: test-lisp venv
	CL_MCP_SOAK_ROUNDS=$(SOAK_ROUNDS) CL_MCP_SOAK_SEED=$(SOAK_SEED) \
	  $(VENV)/bin/python -m pytest -s -q tests/integration/test_chaos_soak.py

bench: lisp bench-lisp venv
	$(VENV)/bin/python bench/run.py

profile: lisp venv
	$(VENV)/bin/python bench/profile_lisp.py

setup: test-lisp venv

# The official TypeScript MCP SDK client against cl-mcp (docs/interop.md);
# needs node and npm, and is not part of `make test`.  Attach mode:
# make interop INTEROP_ARGS='--connect 127.0.0.1:4005'
interop: lisp venv
	cd interop/ts-client && npm ci --no-audit --no-fund >&2
	node interop/ts-client/check.mjs $(VENV)/bin/cl-mcp $(INTEROP_ARGS)

# apt-get install only what is absent: $(call debian,PACKAGES,CONDITION)
define debian
	@if $(2); then \
	  echo "Installing $(1) from Debian" >&2; \
	  $(SUDO) apt-get update >&2 && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y $(1) >&2; \
	fi
endef

lisp:
	$(call debian,sbcl cl-swank,! command -v sbcl >/dev/null || [ ! -f $(SWANK_LOADER) ])

test-lisp: lisp
	$(call debian,cl-alexandria cl-ppcre cl-split-sequence cl-fiveam cl-rt cl-fiasco emacs-nox slime $(CORPUS_PACKAGES),! (cd /usr/share/common-lisp/source && ls $(CORPUS_ASDS) >/dev/null 2>&1) || [ ! -f $(ALEXANDRIA) ] || [ ! -f $(FIVEAM) ] || [ ! -f $(RT) ] || [ ! -f $(FIASCO) ] || [ ! -f $(CL_PPCRE) ] || [ ! -f $(SPLIT_SEQUENCE) ] || ! command -v emacs >/dev/null || ! ls $(SLIME_EL) >/dev/null 2>&1)

# yason, for bench/lisp_server.lisp (the Lisp-native baseline)
bench-lisp: lisp
	$(call debian,cl-yason cl-trivial-gray-streams,[ ! -f $(YASON) ])

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@[ -x $(VENV)/bin/python ] || $(PYTHON) -m venv $(VENV) >&2
	@$(VENV)/bin/python -m pip install --quiet --upgrade pip >&2
	@$(VENV)/bin/python -m pip install --quiet -e '.[test]' >&2
	@touch $@

clean:
	rm -rf $(VENV) .pytest_cache
