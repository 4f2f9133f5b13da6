# Two commands do everything on a fresh Debian 12 machine (see README.md):
#   make demo   the main job on the bundled model
#   make test   build and run every test (plus clang-tidy, the parsers under ASan+UBSan,
#               the fuzz smoke, the arm64 bit-identity tests under qemu, and the wasm
#               bit-identity tests under node.js)
BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
ARM64_BUILD ?= build-arm64
WASM_BUILD ?= build-wasm
FUZZ_SECONDS ?= 600
JOBS       ?= $(shell nproc)
CMAKE_GEN  := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")
BIN        := $(BUILD)/apps/cli/daisychain

LINT_EXCLUDE ?= scripts/lint-exclude.txt
TIDY_SCOPE ?= modules

.PHONY: all deps configure build test test-unit asan-build test-asan arm64-build test-arm64 wasm-build test-wasm prebuild fuzz-build fuzz fuzz-smoke format lint tidy demo bench clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test-unit: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The parsers (safetensors, config, tokenizer, ...) again under AddressSanitizer and
# UndefinedBehaviorSanitizer: every test labelled "parser".
asan-build: deps
	cmake -S . -B $(ASAN_BUILD) $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Debug -DDAISY_SANITIZE=ON -DDAISY_BUILD_BENCH=OFF
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target daisy_parser_tests

test-asan: asan-build
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) -L parser

# libFuzzer targets (clang, ASan+UBSan): the safetensors header, config -> spec, the
# tokenizer, the wire decoder and the chat-template parser (fuzz/).
fuzz-build: deps
	cmake -S . -B $(FUZZ_BUILD) $(CMAKE_GEN) -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
	  -DDAISY_FUZZ=ON -DDAISY_BUILD_TESTS=OFF -DDAISY_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target daisy_fuzzers

# Each target for FUZZ_SECONDS (default 600).
fuzz: fuzz-build
	FUZZ_BUILD=$(FUZZ_BUILD) bash scripts/fuzz.sh run $(FUZZ_SECONDS)

# make test: replay the seeds and every regression input, then a few seconds of each.
fuzz-smoke: fuzz-build
	FUZZ_BUILD=$(FUZZ_BUILD) bash scripts/fuzz.sh smoke 5

# arm64: the kernels, detmath and forward bit-identity tests (stories260K included, against
# x86-64's golden digest) cross-built with g++-aarch64-linux-gnu and run under qemu-aarch64
# (scripts/test-arm64.sh; incremental build in ARM64_BUILD). Prints its build and run time.
test-arm64: deps
	@start=$$(date +%s); BUILD_DIR=$(abspath $(ARM64_BUILD)) JOBS=$(JOBS) bash scripts/test-arm64.sh && \
	  echo "test-arm64: $$(( $$(date +%s) - start )) s in all"

# wasm: the kernels (the SIMD128 backend == scalar, its gate), detmath and forward
# bit-identity tests (stories260K against x86-64's golden digest) built with Debian's
# emscripten and run under node.js, and the JS-callable engine (apps/wasm) whose probe hash
# must equal the native binary's (scripts/test-wasm.sh; incremental build in WASM_BUILD).
# Prints its build and run time.
test-wasm: deps
	@start=$$(date +%s); BUILD_DIR=$(abspath $(WASM_BUILD)) JOBS=$(JOBS) NATIVE_BIN=$(abspath $(BIN)) \
	  bash scripts/test-wasm.sh && echo "test-wasm: $$(( $$(date +%s) - start )) s in all"

# clang-format in place over the first-party C++ files, but those LINT_EXCLUDE lists
# (`make format LINT_EXCLUDE=` takes every file).
format:
	LINT_EXCLUDE="$(LINT_EXCLUDE)" bash scripts/lint.sh format

# The checks of `make test` alone: clang-format (also the ctest test format_check), the
# dependency rule (ctest deps_rule) and clang-tidy; `make lint LINT_EXCLUDE=` checks every file.
lint: configure
	LINT_EXCLUDE="$(LINT_EXCLUDE)" bash scripts/lint.sh format-check
	python3 scripts/check_deps.py $(BUILD)/daisy_deps.json --exclude "$(LINT_EXCLUDE)"
	$(MAKE) --no-print-directory tidy

# clang-tidy over the module libraries' .cc files (TIDY_SCOPE=modules; all: the tests, apps,
# tools and bench too; README.md says why not by default),
# JOBS at a time, from $(BUILD)/compile_commands.json. Prints its time.
tidy: configure
	BUILD=$(BUILD) JOBS=$(JOBS) LINT_EXCLUDE="$(LINT_EXCLUDE)" TIDY_SCOPE="$(TIDY_SCOPE)" bash scripts/lint.sh tidy

# The builds of the other test stages alone (incremental; the stages above build too).
arm64-build: deps
	BUILD_DIR=$(abspath $(ARM64_BUILD)) JOBS=$(JOBS) BUILD_ONLY=1 bash scripts/test-arm64.sh

wasm-build: deps
	BUILD_DIR=$(abspath $(WASM_BUILD)) JOBS=$(JOBS) BUILD_ONLY=1 bash scripts/test-wasm.sh

prebuild: asan-build fuzz-build arm64-build wasm-build

# Everything, in this order: build, ctest, clang-tidy, ASan, fuzz smoke, arm64, wasm. Most
# of ctest's time is its serial ring tests waiting on sockets, so the later stages' builds
# (`prebuild`) run beside it at the lowest CPU priority (scripts/test-all.sh).
test: build
	BUILD=$(BUILD) JOBS=$(JOBS) bash scripts/test-all.sh

demo: build
	$(BIN) demo

bench: build
	$(BIN) bench

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(ARM64_BUILD) $(WASM_BUILD)
