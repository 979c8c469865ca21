"""The runtime: compile and cache kernels, dispatch per device and shape, launch, autograd."""


def _use_interpreter_without_gpu() -> None:
    # Triton picks interpreter or GPU compilation when `triton.language` is imported, so the
    # choice must be made before the runtime imports it: without a CUDA device, interpret.
    import os

    import torch

    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_use_interpreter_without_gpu()
