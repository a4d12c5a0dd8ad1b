# The two commands a newcomer needs:  `make run` (set up + the main job) and `make test`.
.PHONY: run test setup bench
setup:
	@bash scripts/setup.sh

run: setup
	.venv/bin/rstar pipeline run --config configs/tiny.yaml

test: setup
	PYTHONFAULTHANDLER=1 .venv/bin/python -m pytest -q

bench: setup
	.venv/bin/rstar sandbox bench
