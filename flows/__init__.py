"""Prefect flows (the training pipeline, re-evaluation) and their deployments."""
