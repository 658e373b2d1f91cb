# Loom — two commands do everything on a fresh Debian 12 machine:
#   make demo   install, build, train the default model (char GPT on tiny Shakespeare), sample
#   make test   install, build, run the tests
# Other targets: build, fleet-demo (the live fleet service on this machine), test-asan, bench,
# format, clean.
.PHONY: all deps build demo fleet-demo test test-asan bench format check-floors clean

JOBS ?= 2
BUILD := build/release

all: build

deps:
	scripts/install-deps

build: deps
	cmake --preset release
	cmake --build --preset release -j $(JOBS)

demo: build
	$(BUILD)/loom train --out out/demo
	$(BUILD)/loom sample out/demo/checkpoint --prompt "ROMEO:" --tokens 400

fleet-demo: build
	scripts/fleet-demo $(BUILD)/loom

test: build
	scripts/check-floors
	ctest --preset release -j $(JOBS)

test-asan: deps
	cmake --preset asan
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS)

bench: build
	scripts/install-deps --bench
	bench/compare_torch

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')

check-floors:
	scripts/check-floors

clean:
	rm -rf build out
