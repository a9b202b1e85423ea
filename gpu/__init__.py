"""moelab's real megakernel: build, launch and observe the CUDA MoE layer on 1..N GPUs.

`import gpu` needs NumPy alone; torch, cuda.core and nvshmem4py are imported inside the
functions that use them, so CI and the app can import this package on machines without a GPU.
Modules: layout (what the kernel supports, buffer sizes, the argument block), build (nvcc,
cubin cache), errors (the kernel's error record), telemetry (device logs -> sim.trace.Trace),
runtime (NVSHMEM session and the layer), moe_layer (MoELayer: the kernel for a torch model under
torchrun), baseline (the torch layer), worker and spawn (one process per GPU), cli (`moelab gpu`).
"""

from .errors import KernelError, KernelTimeout
from .layout import UnsupportedConfig, check_supported
from .moe_layer import MoELayer

__all__ = ["KernelError", "KernelTimeout", "MoELayer", "UnsupportedConfig", "check_supported"]
