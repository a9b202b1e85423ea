"""How many CUDA GPUs the GPU tests can use: 0 without torch or a CUDA device, so they skip cleanly."""


def count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
