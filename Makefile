# Loom — two commands do everything on a fresh Debian 12 machine:
#   make demo   install, build, train the default model (char GPT on tiny Shakespeare), sample
#   make test   install, build, run the tests
#   make llama-demo   a small Llama on tiny Shakespeare: BPE tokenizer, Megatron corpus, sample
# Other targets: build, fleet-demo (the live fleet service on this machine), test-asan,
# test-repeat (both suites N times each, N=5 by default: every test that failed at least once),
# bench (bench/run-all: every CPU table of bench/RESULTS.md, into build/bench/),
# layouts (every tp x pipeline x dp layout of 2, 4 and 8 processes against one process),
# checkpoints (a sharded checkpoint of each of 8 layouts loaded at every other one),
# fuzz (libFuzzer on every reader of untrusted files, FUZZ_SECONDS each; fuzz/README.md),
# torch (the PyTorch device "loom": the extension against the pinned torch, and its tests),
# format, clean.
.PHONY: all deps build demo llama-demo fleet-demo test test-asan test-repeat bench layouts checkpoints fuzz torch test-torch torch-tests format check-floors check-size clean

JOBS ?= 2
BUILD := build/release
FUZZ_SECONDS ?= 60
FUZZ_HARNESSES ?=

all: build

deps:
	scripts/install-deps

build: deps
	cmake --preset release
	cmake --build --preset release -j $(JOBS)

demo: build
	$(BUILD)/loom train --out out/demo
	$(BUILD)/loom sample out/demo/checkpoint --prompt "ROMEO:" --tokens 400

# The small Llama on tiny Shakespeare through a BPE tokenizer and a Megatron corpus
# (configs/llama_shakespeare.yaml): prepare, train (about ten minutes on two cores), sample.
llama-demo: build
	mkdir -p build/corpus
	$(BUILD)/loom data prepare --tokenizer configs/tokenizers/shakespeare-bpe \
	    --out build/corpus/shakespeare data/tinyshakespeare/input.txt
	$(BUILD)/loom train configs/llama_shakespeare.yaml
	$(BUILD)/loom sample out/llama_shakespeare/checkpoint --prompt "ROMEO:" --tokens 200

fleet-demo: build
	scripts/fleet-demo $(BUILD)/loom

test: build
	scripts/check-floors
	scripts/check-size
	ctest --preset release -j $(JOBS)

test-asan: deps
	cmake --preset asan
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS)

# The release and the sanitizer suites N times each (alternating), then every test that
# failed in any run, with the output of each failure (build/test-repeat/report.md).
N ?= 5
test-repeat: build
	cmake --preset asan
	cmake --build --preset asan -j $(JOBS)
	scripts/test-repeat $(N) $(JOBS)

# Every CPU figure of bench/RESULTS.md, regenerated into build/bench/NAME.txt with a summary
# (about an hour and a half on 2 cores; bench/run-all --list names each item, --quick is a smoke run).
bench: build
	scripts/install-deps --bench
	bench/run-all

# Every combination of tensor, pipeline and data parallelism with 2, 4 or 8 processes that a
# small Llama-family model admits, against one process (losses, estimates, step-1 gradients),
# as the Markdown table of bench/RESULTS.md; the layouts it does not admit, with the reason.
layouts: build
	tests/dist/test_layouts.sh mpiexec $(BUILD)/loom all | tee build/layouts.md

# A sharded checkpoint saved at each of 8 layouts (1, 2 and 4 processes: tp, pipeline, dp with
# the distributed optimizer) loaded at every other one: saved again, bitwise; 10 further steps,
# as an uninterrupted run there. The Markdown table of bench/RESULTS.md.
checkpoints: build
	tests/dist/test_checkpoints.sh mpiexec $(BUILD)/loom all | tee build/checkpoints.md

# The PyTorch device (python/loom_torch, src/torch, docs/pytorch.md): the pinned Python
# environment (scripts/python-env; a large download the first time), the extension built
# against its torch into $(BUILD)/python, and the device's tests on every Loom device (the
# CUDA backend on its emulator where no GPU is present). `make test-torch` does the same in
# an environment of its own with only torch and numpy ($(BUILD)/torch-env, about a minute
# to install): the form CI will run once it has the minutes (docs/pytorch.md, "CI").
torch: build
	scripts/install-deps --torch
	scripts/python-env
	$(MAKE) torch-tests TORCH_PYTHON=$(CURDIR)/.venv/bin/python

test-torch: build
	scripts/install-deps --torch
	LOOM_PYTHON_ENV=$(CURDIR)/$(BUILD)/torch-env LOOM_PYTHON_PACKAGES="torch numpy" scripts/python-env
	$(MAKE) torch-tests TORCH_PYTHON=$(CURDIR)/$(BUILD)/torch-env/bin/python

torch-tests:
	cmake --preset release -DLOOM_TORCH=ON -DLOOM_TORCH_PYTHON=$(TORCH_PYTHON)
	cmake --build --preset release -j $(JOBS) --target loom_torch_C
	LOOM_CUDA_EMULATOR=1 PYTHONPATH=$(BUILD)/python $(TORCH_PYTHON) -m unittest discover -s tests/torch -v

# Clang build in build/fuzz (cmake --preset fuzz), corpora from the repository's fixtures,
# then each harness for FUZZ_SECONDS; findings land in build/fuzz/findings/HARNESS/.
fuzz:
	scripts/install-deps
	scripts/install-deps --fuzz
	cmake --preset fuzz
	cmake --build --preset fuzz -j $(JOBS)
	fuzz/make-corpus build/fuzz $(FUZZ_HARNESSES)
	fuzz/run --seconds $(FUZZ_SECONDS) build/fuzz $(FUZZ_HARNESSES)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')

check-floors:
	scripts/check-floors

check-size:
	scripts/check-size

clean:
	rm -rf build out
