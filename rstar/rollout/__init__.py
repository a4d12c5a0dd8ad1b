"""Turning a policy and problems into trajectories: engines, scheduling, the rollout runner."""
