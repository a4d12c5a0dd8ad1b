"""The Prefect task that runs any pipeline stage (`stage`), thin over `rstar`: it launches the
stage as a Ray job; with its progress artifacts (`progress`), summary artifact (`summary`) and
terminal output (`console`)."""
