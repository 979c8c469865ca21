"""The runtime: compile and cache kernels, dispatch per device and shape, launch, autograd."""
