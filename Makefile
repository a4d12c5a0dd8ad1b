# The two commands a newcomer needs:  `make run` (set up + the main job) and `make test`
# (the lint, then the suite: what CI runs, through .ci/run).
.PHONY: run test lint format setup bench
setup:
	@bash scripts/setup.sh

run: setup
	.venv/bin/rstar pipeline run --config configs/tiny.yaml

test: lint
	PYTHONFAULTHANDLER=1 .venv/bin/python -m pytest -q

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format: setup
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

bench: setup
	.venv/bin/rstar sandbox bench
