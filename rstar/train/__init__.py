"""Trainers: non-reasoning SFT and single-machine GRPO-RoC; the launcher for verl on a cluster."""
