"""Prefect tasks, one per pipeline stage; thin wrappers over `rstar` that launch Ray jobs."""
