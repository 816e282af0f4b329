"""verl's platform for a machine without a GPU: the device module is torch.cpu and collectives are gloo.

Test-only. Used by tests/verl_worker_harness.py (verl's workers in one process, no Ray) and by the end-to-end
stand-ins in tests/e2e/stand_ins.py (verl's whole loop on Ray, where each worker asks Ray for a "GPU" that
the test's Ray head declares: `ray_resource` says which resource a worker reserves).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from verl.plugin.platform import PlatformBase


class CPUDeviceModule:
    """torch.cpu, plus the memory and RNG calls verl makes on its device module."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    def is_available(self):
        return True

    def current_device(self):
        return torch.device("cpu")

    def device_count(self):
        return 1

    def get_device_name(self, *args):
        return "CPU"  # verl's flops counter: an unknown device, no MFU

    def set_device(self, *args):
        pass

    def synchronize(self, *args, **kwargs):
        pass

    def empty_cache(self):
        pass

    def max_memory_allocated(self, *args, **kwargs):
        return 0

    max_memory_reserved = memory_allocated = memory_reserved = max_memory_allocated

    def mem_get_info(self, *args, **kwargs):
        return 0, 0

    def set_per_process_memory_fraction(self, *args, **kwargs):
        pass

    def get_rng_state(self, *args, **kwargs):
        return torch.get_rng_state()

    def set_rng_state(self, state, *args, **kwargs):
        torch.set_rng_state(state)

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    manual_seed_all = manual_seed


class CPUPlatform(PlatformBase):
    device_name = "cpu"
    vendor_name = "cpu"
    device_module = CPUDeviceModule()
    ray_resource = "CPU"

    def is_available(self):
        return True

    def is_platform_available(self, use_smi_check=False):
        return True

    def current_device(self):
        return torch.device("cpu")  # FSDP's device_id: the CPU

    def device_count(self):
        return 1

    def set_device(self, device_index):
        pass

    def synchronize(self, device_index=None):
        pass

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def set_allocator_settings(self, settings):
        pass

    def empty_cache(self):
        pass

    def get_device_capability(self, device_index=0):
        return None, None

    def communication_backend_name(self):
        return "gloo"

    def visible_devices_envvar(self):
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg):
        yield

    def profiler_start(self):
        pass

    def profiler_stop(self):
        pass

    def ray_resource_name(self):
        return self.ray_resource

    def ray_noset_envvars(self):
        return []

    def is_ipc_supported(self):
        return False  # no CUDA IPC: weights reach the rollout engine through shared memory

    def cudart(self):
        return None
