"""verl on CPU: a platform for verl's plug-in registry, so its own trainer runs the tiny model here.

Loaded in every verl process through `VERL_USE_EXTERNAL_MODULES=rstar.train.verl_cpu` and
selected by `VERL_PLATFORM=cpu`: torch's CPU device, gloo for collectives. verl places one
training process per Ray "GPU" and checks the cluster's GPU (or NPU) count before it starts
(`verl/single_controller/ray/base.py`, `ResourcePoolManager._check_resource_available`), so a
CPU run starts Ray declaring as many GPUs as training processes (`ray.init(num_gpus=N)`): here
they are slots, torch never sees a GPU. The rollouts run on vLLM's CPU build through verl's
own vLLM replicas (rstar.rollout.vllm_cpu lets its weights be updated). For CI and for trying
the cluster path on a laptop; never for training anything real.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import torch
import verl.utils.distributed as _distributed
from verl.plugin.platform import PlatformBase, PlatformRegistry

RAY_RESOURCE = "GPU"  # slots for training processes (module docstring)


def _noop(*args, **kwargs):
    return None


# What verl calls on `get_torch_device()`: torch.cpu has some of it, the rest are no-ops on CPU.
DEVICE_MODULE = SimpleNamespace(
    is_available=lambda: True,
    current_device=lambda: "cpu",
    device_count=lambda: 1,
    set_device=_noop,
    synchronize=_noop,
    empty_cache=_noop,
    manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed,
    get_rng_state=torch.get_rng_state,
    set_rng_state=torch.set_rng_state,
    memory_allocated=lambda *a, **k: 0,
    memory_reserved=lambda *a, **k: 0,
    max_memory_allocated=lambda *a, **k: 0,
    max_memory_reserved=lambda *a, **k: 0,
    reset_peak_memory_stats=_noop,
    mem_get_info=lambda *a, **k: (0, 0),
    Stream=None,
    stream=None,
    is_initialized=lambda: True,
    get_device_name=lambda *a: "cpu",
    ipc_collect=_noop,
)


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self):
        return DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return False  # never auto-detected: only VERL_PLATFORM=cpu selects it

    def current_device(self) -> str:
        return "cpu"  # verl moves tensors with `.to(get_device_id())`: on this platform, to the CPU

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index=None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "RSTAR_VISIBLE_CPU_SLOTS"

    def ray_resource_name(self) -> str:
        return RAY_RESOURCE

    def ray_resource_options(self, num_gpus: float) -> dict:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def cudart(self):
        return None


def _gloo_process_group(initialize):
    """verl joins its training processes with the backend string "cpu:gloo,<device>:<backend>",
    which torch refuses when the device is the CPU too ("Duplicate device type cpu",
    `verl/utils/distributed.py`, `initialize_global_process_group_ray`): on this platform, gloo
    alone."""

    def init(timeout_second=None, backend=None):
        return initialize(timeout_second=timeout_second, backend=backend or "gloo")

    return init


# Patched on import, before verl's workers import the function by name (this module is loaded
# by `import verl` itself, through VERL_USE_EXTERNAL_MODULES, in every verl process).
_distributed.initialize_global_process_group_ray = _gloo_process_group(
    _distributed.initialize_global_process_group_ray
)


def _register_fsdp_engine() -> None:
    """verl registers its FSDP training engine for CUDA and NPU devices only; FSDP2 itself runs on
    a CPU device mesh with gloo, so the same engine class serves this platform."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import FSDPEngineWithLMHead

    EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(
        FSDPEngineWithLMHead
    )


_register_fsdp_engine()
