# The README's commands. Each target does all the set-up it needs: `make quickstart` and
# `make serve` only the store's (seconds), `make test` everything the tests use (minutes, once).
.PHONY: setup setup-store quickstart serve test test-quick lint typecheck bench proto clean

setup:
	bash scripts/setup.sh all

setup-store:
	bash scripts/setup.sh store

quickstart: setup-store
	bash scripts/quickstart.sh

serve: setup-store
	.venv/bin/kvstore serve

# What .ci/run runs: lint and type checks, then every test (the slow ones too: the wheel, the examples).
test: setup lint typecheck
	.venv/bin/python -m pytest -q

test-quick: setup
	.venv/bin/python -m pytest -q -m "not slow and not faults"

# Every shipped line and the tests. mypy is strict everywhere but in tests/, which may leave test
# functions unannotated (pyproject.toml: the tests.* override); run from the repository root, where
# `from tests.cluster import ...` resolves (tests/ is a package).
lint: setup
	.venv/bin/ruff check kvstore benchmarks tests scripts examples
	.venv/bin/ruff format --check kvstore benchmarks tests scripts examples

typecheck: setup
	.venv/bin/mypy kvstore benchmarks tests scripts examples

bench: setup
	.venv/bin/kvstore bench

proto: setup
	.venv/bin/python scripts/gen_proto.py

# What `kvstore serve` left on disk: segment files of killed daemons (an SSD tier: `kvstore clean --ssd-dir DIR`).
clean: setup-store
	.venv/bin/kvstore clean
