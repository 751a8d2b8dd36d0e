.PHONY: setup serve test lint
# Arguments for the runtime, e.g. make serve ARGS="--port 9000".
ARGS ?=

setup:
	bash scripts/setup.sh

serve: setup
	.venv/bin/pagoda-runtime serve $(ARGS)

test:
	bash scripts/test.sh

lint: setup
	.venv/bin/ruff check .
