"""The runtime: compile and cache kernels, dispatch per device and shape, launch, autograd."""

import os
import sys


def select_triton_mode() -> None:
    """Without a CUDA device, run kernels on Triton's CPU interpreter.

    Triton picks interpreter or GPU compilation when `triton.language` is imported, so this
    must run before anything imports it; `import attnfuse` calls it early when torch is
    already loaded, and the runtime calls it when it loads.
    """
    import torch

    if "TRITON_INTERPRET" in os.environ or torch.cuda.is_available():
        return
    if "triton.language" in sys.modules:
        # Too late to switch this process to the interpreter; launching will say so.
        return
    os.environ["TRITON_INTERPRET"] = "1"


select_triton_mode()
