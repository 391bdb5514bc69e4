# The two commands a new user runs (README.md): `make run` and `make test`. Each installs what it
# needs first (scripts/bootstrap, idempotent), configures with CMake/Ninja and builds.
BUILD  ?= build
JOBS   ?= $(shell nproc)
CUDA   ?= AUTO
MODEL  ?= models/strata-demo-moe.gguf
PROMPT ?= And it came to pass, when the king
FUZZ_SECONDS ?= 60

.PHONY: all deps configure build run test fuzz bench clean

all: build

deps:
	@scripts/bootstrap

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=$(CUDA) >/dev/null

build: configure
	cmake --build $(BUILD) -j$(JOBS)

run: build
	./$(BUILD)/strata run -m $(MODEL) -p "$(PROMPT)" -n 48

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS) --timeout 900
	$(MAKE) --no-print-directory fuzz

# libFuzzer targets under ASan+UBSan (clang), each run for a bounded time, seeded with the fixtures.
fuzz: deps
	@scripts/fuzz $(FUZZ_SECONDS)

bench: build
	@ls $(BUILD)/bench/bench_* 2>/dev/null | while read b; do echo "== $$b"; $$b; done

clean:
	rm -rf $(BUILD) build-fuzz
