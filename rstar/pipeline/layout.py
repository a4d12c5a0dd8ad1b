"""Where each stage's files live under the storage root (a local directory or s3://prefix)."""

from __future__ import annotations

import os

from rstar.storage import dirs, is_remote


class Layout:
    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/") if is_remote(root) else os.path.abspath(root)

    def dataset(self, name: str) -> str:
        return f"{self.root}/datasets/{name}.parquet"

    def model(self, stage: str) -> str:
        return f"{self.root}/models/{stage}"

    def finished_sft(self) -> str:
        """The SFT checkpoint of a finished run (what benchmarks start from), or an error saying
        how to get one."""
        sft = self.model("sft")
        if not os.path.isdir(sft):
            raise FileNotFoundError(
                f"no SFT checkpoint at {sft}: run the pipeline first (`make run`), or pass --root "
                "with the storage root of a finished run"
            )
        return sft

    def registered(self, stage: str, digest: str) -> str:
        """Where a registered version of a stage's model lies, never overwritten (dirs.snapshot)."""
        return f"{self.root}/registry/{stage}-{digest}"

    def trajectories(self, stage: str) -> str:
        return f"{self.root}/trajectories/stage={stage}"

    def reports(self, name: str) -> str:
        return f"{self.root}/reports/{name}"

    def marker(self, name: str) -> str:
        """The cache marker of a stage's outputs (rstar.pipeline.cache)."""
        return f"{self.root}/cache/{name}.key"

    def work_uri(self, stage: str) -> str:
        """Where a stage's working directories (its trainer checkpoints) live under the root."""
        return f"{self.root}/work/{stage}"

    def work(self, stage: str) -> str:
        """The local copy of a stage's working directory."""
        return dirs.local_dir(self.work_uri(stage))
