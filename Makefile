# Convenience targets around CMake.
#   make            build (build/)
#   make test       the whole test suite: normal build, then ASan+UBSan build
#   make test-fast  the normal build's tests only
#   make fuzz       build the libFuzzer targets with clang (build-fuzz/)
#   make build-matrix  compile the build types and compilers make test does not build
#                   (build-matrix/), warnings as errors (CI runs it after make test)
#   make deb        the Debian package build/kiln_VERSION_ARCH.deb (scripts/make-deb.sh)
#   make test-zoo-paths  the model zoo on every execution path alone (make test runs it
#                   too, as ctest zoo_paths; tests/python/test_zoo_paths.py, docs/ZOO.md)
#   make bench      model benchmarks against ONNX Runtime and PyTorch (not part of make test)
#   make bench-serve  serving benchmark (wrk) against Flask+PyTorch and Node+ONNX Runtime
JOBS ?= $(shell nproc)
CTEST_FLAGS ?= --output-on-failure

.PHONY: all build test test-fast test-sanitize test-zoo-paths fuzz clean bench bench-serve build-matrix deb

all: build

build:
	cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WERROR=ON >/dev/null
	cmake --build build -j$(JOBS)

test-fast: build
	cd build && ctest $(CTEST_FLAGS)

test-sanitize:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON -DKILN_WERROR=ON >/dev/null
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  KILN_SANITIZED=1 ctest $(CTEST_FLAGS)

test: test-fast test-sanitize

test-zoo-paths: build
	KILN_BIN=$(CURDIR)/build/kiln /usr/bin/python3 -m pytest -q -rxXs -p no:cacheprovider \
	  tests/python/test_zoo_paths.py

fuzz:
	CC=clang cmake -S . -B build-fuzz -DKILN_FUZZ=ON -DKILN_WERROR=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build build-fuzz -j$(JOBS)

# make test builds gcc RelWithDebInfo and gcc Debug (with the sanitizers); these are the
# others a packager might use. Compiling is the check: -Werror on, no tests run.
BUILD_MATRIX ?= gcc:Release gcc:Debug clang:Release clang:Debug clang:RelWithDebInfo
build-matrix:
	@for c in $(BUILD_MATRIX); do cc=$${c%%:*}; t=$${c#*:}; d=build-matrix/$$cc-$$t; \
	  echo "== $$cc $$t ($$d)"; \
	  CC=$$cc cmake -S . -B $$d -DCMAKE_BUILD_TYPE=$$t -DKILN_WERROR=ON >/dev/null && \
	  cmake --build $$d -j$(JOBS) >$$d.log 2>&1 || { tail -40 $$d.log; exit 1; }; \
	done

deb: build
	scripts/make-deb.sh build build

bench: build
	@if [ -x bench/run.sh ]; then bench/run.sh; else echo "bench/run.sh not present yet"; fi

bench-serve: build
	bench/serve/run.sh

clean:
	rm -rf build build-asan build-fuzz build-matrix
