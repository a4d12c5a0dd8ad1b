"""Side-by-side runs against the tools people would pick instead of this project
(`rstar bench-peers`): Hugging Face TRL's GRPOTrainer on the same model, problems, tool,
sandbox and reward (`trl_grpo`); verl's ToolAgentLoop over the same engine and sandbox
(`verl_loop`); code-judge, the rStar2-Agent release's sandbox, through its own API
(`code_judge`). And `rstar bench-engines`: vLLM's CPU build, what people would serve rollouts
with, against the embedded HF engine (`engines`)."""
