"""Ahead-of-time compiles of printed portable kernels for the H200's target (sm_90,
`GPUTarget`; no GPU needed), shared by the lowering tests that read what Triton makes of them."""

from __future__ import annotations

import pytest

INDEX_ROLES = ("kv_lens", "block_table")
"""Roles whose pointers are int32."""

FP32_ROLES = ("o_part", "lse_part", "lse")
"""Roles whose pointers are fp32 (the rest are fp16)."""


def skip_unless_aot(module_level: bool = False) -> None:
    """Skip unless this process's Triton compiles for a GPU target: it has the ahead-of-time
    interface, and it was not imported for its interpreter (TRITON_INTERPRET=1), whose library
    functions are interpreter-only."""
    triton = pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler.compiler import ASTSource  # noqa: F401
    except ImportError:  # pragma: no cover - a Triton without ahead-of-time compiles
        pytest.skip("this Triton cannot compile for a GPU target", allow_module_level=module_level)
    from triton.runtime.jit import JITFunction

    if not isinstance(triton.language.standard.cdiv, JITFunction):
        pytest.skip("Triton was imported for its interpreter (TRITON_INTERPRET=1)", allow_module_level=module_level)


def sm90_compile(fn, stages: int, **options):
    """`fn` compiled for sm_90 with 4 warps, `stages` and the launch `options`, specialized as
    Triton specializes a launch of the runtime's tensors: 16-divisible pointers and strides,
    unit column strides."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    signature, constants, attrs = {}, {}, {}
    for i, (name, param) in enumerate(zip(fn.arg_names, fn.params)):
        if param.is_constexpr:
            signature[name], constants[name] = "constexpr", param.default
        elif name.endswith("_ptr"):
            role = name.removesuffix("_ptr")
            signature[name] = "*i32" if role in INDEX_ROLES else "*fp32" if role in FP32_ROLES else "*fp16"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name.startswith("stride_") and name.endswith("_d"):
            signature[name], constants[name] = "constexpr", 1  # contiguous rows, as Triton specializes
        elif name == "sm_scale":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if name.startswith("stride_"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "num_stages": stages, **options})
