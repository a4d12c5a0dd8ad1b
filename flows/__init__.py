"""Prefect flows (the training pipeline, re-evaluation), their deployments and the pipeline's
commands (flows/cli.py). Entry points set the environment defaults first
(rstar.environment.apply_defaults)."""
