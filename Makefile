# The two commands a newcomer needs:  `make run` (set up + the main job) and `make test`
# (the lint, then the suite: what CI runs, through .ci/run).
.PHONY: run test lint format setup bench mutate
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

# Mutation testing of RoC, the loss, the reward and the local trainer's update and resume
# ([tool.mutmut] in pyproject.toml; not in CI: it takes long). Survivors: CONTRIBUTING.md.
# It resumes where a previous run stopped (state in mutants/; changed functions are re-tested).
mutate: setup
	RSTAR_TESTS_SFT_DIR=$(CURDIR)/.rstar/tests-sft .venv/bin/mutmut run --max-children 2
	.venv/bin/mutmut results
