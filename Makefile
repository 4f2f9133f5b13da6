# Two commands do everything on a fresh Debian 12 machine (see README.md):
#   make demo   the main job on the bundled model
#   make test   build and run every test (plus the parsers under ASan+UBSan)
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
CMAKE_GEN  := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")
BIN        := $(BUILD)/apps/cli/daisychain

.PHONY: all deps configure build test test-unit test-asan demo bench clean

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
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Debug -DDAISY_SANITIZE=ON -DDAISY_BUILD_BENCH=OFF
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target daisy_parser_tests
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) -L parser

test: test-unit test-asan

demo: build
	$(BIN) demo

bench: build
	$(BIN) bench

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
