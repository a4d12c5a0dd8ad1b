"""GRPO-RoC: penalties, Resample-on-Correct down-sampling, advantages and the policy loss."""
