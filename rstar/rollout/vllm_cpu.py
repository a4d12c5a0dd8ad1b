"""vLLM's CPU build as an engine whose weights can be updated: a vLLM general plugin, loaded by
vLLM in each of its processes (entry point `vllm.general_plugins` in pyproject.toml).

vLLM 0.27.1 on the CPU hands each linear layer's weight to oneDNN after loading and replaces
`layer.weight` by an empty tensor (`UnquantizedLinearMethod.process_weights_after_loading`);
the output head keeps its weight but multiplies by the copy oneDNN took. A trainer's weight
update then has nowhere to go (verl's sync fails on the empty parameter and its trainer waits
for ever) or goes unused (the head). With this plugin those layers multiply by their own weight
at each call (`torch.nn.functional.linear`), so an update copied into the parameters is what the
next token uses. It can go when vLLM's CPU build reloads packed weights.

It refuses to start under an `ATEN_CPU_CAPABILITY` narrower than the CPU's kernel set
(`refuse_narrowed_kernels`). It also binds vLLM's compute threads to every core this process
may use. vLLM's automatic binding keeps one core for its scheduler, which polls without
sleeping, and puts the model on the rest. On 2 cores that leaves the model one core, which it
shares with the agent loop and the sandbox. A `VLLM_CPU_OMP_THREADS_BIND` you set yourself
wins. Nothing changes on other platforms.
"""

from __future__ import annotations


def refuse_narrowed_kernels(chosen: str | None, widest: str | None = None) -> None:
    """Raise when torch is told to use a kernel set narrower than the CPU's (`widest`, this
    CPU's when not given): vLLM's CPU build then samples wrong tokens while reporting
    log-probs that agree with a trainer under the same setting, so nothing downstream notices
    (measured on an AVX-512 CPU: the tiny SFT model, 64 rollouts, reward 0.000 with
    ATEN_CPU_CAPABILITY=avx2, about 0.6 without; the HF engine is unaffected)."""
    from rstar.machine import KERNEL_SETS, widest_kernels

    widest = widest or widest_kernels()
    chosen = (chosen or "").lower()
    if chosen in KERNEL_SETS and KERNEL_SETS.index(chosen) < KERNEL_SETS.index(widest):
        raise RuntimeError(
            f"ATEN_CPU_CAPABILITY={chosen} is narrower than this CPU's {widest} kernels: vLLM's "
            "CPU build samples wrong tokens under it; unset it for vLLM (the HF engine takes it)"
        )


def register() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    import os

    refuse_narrowed_kernels(os.environ.get("ATEN_CPU_CAPABILITY"))

    cores = sorted(os.sched_getaffinity(0))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    import torch
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    def keep_weight(self, layer: torch.nn.Module) -> None:
        layer.cpu_linear = torch.nn.functional.linear

    UnquantizedLinearMethod.process_weights_after_loading = keep_weight
    UnquantizedEmbeddingMethod.process_weights_after_loading = keep_weight
