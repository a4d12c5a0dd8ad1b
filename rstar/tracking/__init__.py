"""Tracking: content digests of what stages read and write, and MLflow runs, metrics,
datasets, artifacts, model versions and the lineage read back from them."""
