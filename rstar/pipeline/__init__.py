"""The recipe, the records stages pass, where their files live, the stage bodies, and how a
stage runs as a Ray job. Prefect (tasks/, flows/) sits above this package."""
