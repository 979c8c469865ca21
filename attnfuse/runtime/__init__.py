"""The runtime: compile and cache kernels, dispatch per device and shape, launch, autograd.

Kernels for tensors off the GPU run on Triton's CPU interpreter; which of the two a generated
module's kernels target is chosen when it loads (`cache.triton_target`), so nothing here
depends on the order in which torch, Triton or other libraries were imported.
"""
