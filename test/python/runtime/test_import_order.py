"""AttnFuse runs on the CPU whatever was imported before it (the issue: `import attnfuse`
before torch, or transformers' `torch._dynamo` -> `triton.language` import before the first
call, used to make every CPU call fail).

Each order runs in a fresh interpreter: the state under test is the process's import state.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

CALL = """
import torch
import attnfuse as af
torch.manual_seed(0)
q, k, v = (torch.randn(1, 2, 24, 16) for _ in range(3))
spec = af.attention(af.rope(), af.causal())
out = spec(q, k, v)
ref = af.reference_attention(spec, q.double(), k.double(), v.double())
err = (out.double() - ref).abs().max().item()
assert err < 1e-4, err
assert os.environ.get("TRITON_INTERPRET") == BEFORE, "attnfuse changed TRITON_INTERPRET"
print("ok", err)
"""

ORDERS = {
    "attnfuse before torch": "import attnfuse",
    "torch._dynamo first": "import torch._dynamo",
    "triton.language first": "import triton.language",
    "triton, then attnfuse, then torch._dynamo": "import triton.language, attnfuse, torch._dynamo",
    "transformers first": "from transformers import LlamaForCausalLM",
}


@pytest.mark.parametrize("first", ORDERS.values(), ids=list(ORDERS))
def test_cpu_call_works_whatever_was_imported_first(first, attnfuse_cache_dir):
    if "transformers" in first and importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["ATTNFUSE_CACHE_DIR"] = attnfuse_cache_dir
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, also on a machine with a GPU
    script = f"import os\nBEFORE = os.environ.get('TRITON_INTERPRET')\n{first}\n{CALL}"
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ok"), result.stdout


def test_interpreted_calls_leave_triton_language_as_it_was(attnfuse_cache_dir):
    """`triton.language` imported in GPU mode, then a CPU call: the interpreter's stand-ins
    for Triton's builtins must not stay in `tl` or `tl.core` (a later GPU compile in the same
    process would meet them)."""
    script = """
import triton.language as tl
snapshot = {m: dict(vars(m)) for m in (tl, tl.core, tl.math)}
import torch, attnfuse as af
q = torch.randn(1, 2, 16, 16)
spec = af.attention(af.causal(), af.softcap(3.0), af.sigmoid())
out = spec(q, q, q)
ref = af.reference_attention(spec, q.double(), q.double(), q.double())
assert (out.double() - ref).abs().max().item() < 1e-4
changed = [f"{m.__name__}.{n}" for m, names in snapshot.items() for n, v in names.items()
           if vars(m).get(n) is not v]
assert not changed, changed
print("ok")
"""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["ATTNFUSE_CACHE_DIR"] = attnfuse_cache_dir
    env["CUDA_VISIBLE_DEVICES"] = ""
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ok"), result.stdout
