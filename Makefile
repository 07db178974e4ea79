# The README's commands. `make quickstart` and `make test` each do all the set-up they need.
.PHONY: setup quickstart serve test test-quick bench proto

setup:
	bash scripts/setup.sh

quickstart: setup
	bash scripts/quickstart.sh

serve: setup
	.venv/bin/kvstore serve

test: setup
	.venv/bin/python -m pytest -q

test-quick: setup
	.venv/bin/python -m pytest -q -m "not slow"

bench: setup
	.venv/bin/kvstore bench

proto: setup
	.venv/bin/python scripts/gen_proto.py
