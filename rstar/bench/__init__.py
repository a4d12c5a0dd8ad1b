"""The benchmarks: each measures part of the product and writes its own section of
docs/benchmarks.md (`report`). Only the CLI imports them; the product packages hold only the
product.

- `recipe`, `robustness`: a recipe's time, accuracy per stage and RoC ablation; the recipe over
  seeds, kernel sets and thread counts (`rstar bench-recipe`).
- `sandbox`, `reward`: the sandbox's and the answer checker's throughput and latency.
- `scheduler`, `simulate`, `overhead`: rollout scheduling, simulated at the paper's scale and
  run on real replicas; the scheduler's own cost.
- `peers`: against TRL, verl's ToolAgentLoop, code-judge, and vLLM's CPU build.
"""
