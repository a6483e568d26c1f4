# Stowage: the two commands (README.md).
#   make demo   installs missing packages, builds, replays the bundled real trace
#   make test   installs missing packages, builds, runs the whole test suite and
#               ends with "N passed, N failed, N skipped"
BUILD ?= build
JOBS ?= 2
# Debian packages the build and the tests need (toolchain.md). The CUDA
# toolkit is optional: without it the CUDA backend uses private typedefs.
DEB_PACKAGES := cmake make gcc pkg-config libcriterion-dev libjemalloc-dev zlib1g-dev \
                clang libclang-rt-14-dev valgrind
# The report's browser test (tests/check/report_browser.sh) runs in headless
# Chromium; installed without the recommended desktop packages.
BROWSER_PACKAGES := chromium chromium-driver
# The Python packages of the recorder and its tests (python/requirements.txt:
# the pinned torch, torchvision, transformers, timm), in a virtual environment
# kept outside the clone so that every clone reuses its few GB. VENV_NEWEST: the
# newest torch PyPI offers (python/requirements-torch-newest.txt), for the adapter's tests.
VENV ?= $(HOME)/.cache/stowage/venv
VENV_NEWEST ?= $(HOME)/.cache/stowage/venv-torch-newest

.PHONY: all deps deb-deps python-deps configure build demo test clean

all: build

deps: deb-deps python-deps

# Without PyPI the environment is not made; the tests that need torch skip and say so.
python-deps:
	@bash python/make_venv.sh $(VENV) python/requirements.txt
	@bash python/make_venv.sh $(VENV_NEWEST) python/requirements-torch-newest.txt

deb-deps:
	@missing=""; browser=""; \
	for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	for p in $(BROWSER_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || browser="$$browser $$p"; \
	done; \
	if [ -n "$$missing$$browser" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "Installing:$$missing$$browser"; \
	    apt-get update -qq && \
	    { [ -z "$$missing" ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; } && \
	    { [ -z "$$browser" ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	        --no-install-recommends $$browser >/dev/null; }; \
	  else \
	    echo "Missing Debian packages:$$missing$$browser (run 'make deps' as root)"; exit 1; \
	  fi; \
	fi

# The demo needs no Python package: configure asks for the Debian ones only.
configure: deb-deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DSTOW_WERROR=ON -DSTOW_DEBUG=1 \
	  -DSTOW_TORCH_PYTHON=$(VENV)/bin/python -DSTOW_TORCH_NEWEST_PYTHON=$(VENV_NEWEST)/bin/python \
	  >/dev/null

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# Only the CLI (and the static library it links): the demo runs nothing else.
demo: configure
	cmake --build $(BUILD) -j$(JOBS) --target stowage_cli
	BUILD=$(BUILD) bash bench/demo.sh

# The normal suite (ctest), then the ASan+UBSan suite, TSan stress, valgrind
# subset and bounded fuzzing (tests/check/all.sh, docs/reliability.md); all of
# it runs even when a part fails. tests/check/summary.py then lists each
# skipped test with its reason and each failed test, and ends with
# "N passed, N failed, N skipped", test by test; any failure fails make test.
# Criterion names each skipped test only at verbosity 1; ctest keeps every
# test's whole output in the JUnit file (by default it cuts a passed test's to 1 KiB).
RESULTS = $(abspath $(BUILD))/test-results
test: python-deps build
	@rm -rf $(RESULTS) && mkdir -p $(RESULTS); status=0; \
	(cd $(BUILD) && CRITERION_VERBOSITY_LEVEL=1 ctest --output-on-failure -j$(JOBS) \
	  --output-junit $(RESULTS)/ctest.xml \
	  --test-output-size-passed 8000000 --test-output-size-failed 8000000) || status=1; \
	BUILD=$(BUILD) JOBS=$(JOBS) STOW_TEST_RESULTS=$(RESULTS) bash tests/check/all.sh || status=1; \
	python3 tests/check/summary.py report $(RESULTS) || status=1; \
	exit $$status

clean:
	rm -rf $(BUILD)
