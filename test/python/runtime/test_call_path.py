"""The per-call host path reuses what depends only on the call's shapes and arguments' identity
(block lists of an unchanged layout, the plan's checks) and still rejects every bad call.

Build counts are observed by wrapping the block-list builders; kernel launches are recorded
instead of run where only the host path is under test, and run for real (Triton's
interpreter) where results are compared with the float64 reference.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from conftest import assert_close_to_reference, make_qkv

import attnfuse as af
from attnfuse.errors import ArgumentError
from attnfuse.runtime import api, attention_autograd, call_binding, direct_apply
from attnfuse.runtime import launch as launch_module
from attnfuse.runtime.tensor_cache import TENSORS_PER_PLAN
from attnfuse.runtime.reference import gradient_errors, reference_attention, reference_gradients


@pytest.fixture
def builds(monkeypatch):
    """Counts of block-list builds (`call_block_lists` called by the call path): `sparse`, the
    query-block lists (the forward's, and the dQ kernel's in a backward), `transposed`, the
    dK/dV kernel's (built with the backward's)."""
    counts = {"sparse": 0, "transposed": 0}
    build = call_binding.call_block_lists

    def count(sources, band, problem, config, backward, ranks=False, dq_lists=True):
        counts["sparse"] += 1
        counts["transposed"] += int(backward)
        return build(sources, band, problem, config, backward, ranks, dq_lists)

    monkeypatch.setattr(call_binding, "call_block_lists", count)
    return counts


@pytest.fixture
def no_launches(monkeypatch):
    """Kernel launches recorded (by kernel name), not run."""
    names: list[str] = []
    monkeypatch.setattr(launch_module.KernelLaunch, "__call__", lambda self, tensors: names.append(self.info.name))
    return names


def tiny(requires_grad: bool = False, n: int = 64):
    q, k, v = make_qkv(b=1, hq=2, nq=n, nk=n, d=16, seed=1)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


def layouts(count: int, blocks: int = 4) -> list[torch.Tensor]:
    result = []
    for seed in range(count):
        gen = torch.Generator().manual_seed(seed)
        layout = torch.rand(blocks, blocks, generator=gen) < 0.5
        layout.fill_diagonal_(True)
        result.append(layout)
    return result


def test_forward_builds_lists_once_per_layout(builds, no_launches):
    fn = af.compile(af.attention(af.block_sparse(16)))
    q, k, v = tiny()
    (layout,) = layouts(1)
    for _ in range(5):
        fn(q, k, v, block_layout=layout)
    assert builds == {"sparse": 1, "transposed": 0}
    per_head = layout.expand(2, -1, -1).clone()  # a [Hq, rows, cols] layout: its own entry
    for _ in range(3):
        fn(q, k, v, block_layout=per_head)
    assert builds == {"sparse": 2, "transposed": 0}


def test_training_step_builds_lists_once_per_layout(builds, no_launches):
    fn = af.compile(af.attention(af.block_sparse(16)))
    q, k, v = tiny(requires_grad=True)
    (layout,) = layouts(1)
    for _ in range(4):
        fn(q, k, v, block_layout=layout).sum().backward()
    # Once for the forward, once for the backward's dQ lists, once for its dK/dV lists.
    assert builds == {"sparse": 2, "transposed": 1}


@pytest.mark.parametrize("request_", ["separate", "ordered", "fused"])
def test_a_backward_gets_the_lists_its_kernels_read(request_, monkeypatch, no_launches):
    """The split backward's dQ kernel walks query-block lists, a fused backward has no dQ
    kernel (none are built for it); its dK/dV kernel walks the transposed lists, with each
    entry's rank where dQ is added in key-block order."""
    from attnfuse.runtime.backward_choice import BACKWARD_ENV

    monkeypatch.setenv(BACKWARD_ENV, request_)
    built: list[set[str]] = []
    build = call_binding.call_block_lists

    def record(*args):
        lists = build(*args)
        built.append(set(lists))
        return lists

    monkeypatch.setattr(call_binding, "call_block_lists", record)
    fn = af.compile(af.attention(af.block_sparse(16)), deterministic=request_ != "fused")
    q, k, v = tiny(requires_grad=True)
    (layout,) = layouts(1)
    fn(q, k, v, block_layout=layout).sum().backward()
    forward, backward = built
    assert forward == {"full_blocks", "full_count", "partial_blocks", "partial_count"}
    transposed = {f"{kind}_q_{what}" for kind in ("full", "partial") for what in ("blocks", "count")}
    ranks = {"full_q_rank", "partial_q_rank"} if request_ == "ordered" else set()
    assert backward == (forward if request_ == "separate" else set()) | transposed | ranks


def test_layers_alternating_layouts_do_not_thrash(builds, no_launches):
    """Two layers share one layout object, a third uses another (a model with 2-3 layouts):
    each layout's lists are built once, however the calls interleave."""
    fn = af.compile(af.attention(af.block_sparse(16)))
    q, k, v = tiny(requires_grad=True)
    shared, other, third = layouts(3)
    for _ in range(3):
        with torch.no_grad():
            for layout in (shared, other, shared, third):
                fn(q, k, v, block_layout=layout)
    assert builds == {"sparse": 3, "transposed": 0}
    for _ in range(3):  # a training step: every forward, then the backwards in reverse
        out = sum(fn(q, k, v, block_layout=layout).sum() for layout in (shared, other, shared, third))
        out.backward()
    assert builds == {"sparse": 3 + 3 * 2, "transposed": 3}


def test_changed_layout_rebuilds(builds, no_launches):
    fn = af.compile(af.attention(af.block_sparse(16)))
    q, k, v = tiny()
    (layout,) = layouts(1)
    fn(q, k, v, block_layout=layout)
    layout[0, 3] = not layout[0, 3]  # in place: a new version
    fn(q, k, v, block_layout=layout)
    assert builds["sparse"] == 2
    fn(q, k, v, block_layout=layout.T)  # same storage and version, another object
    fn(q, k, v, block_layout=layout.clone())
    assert builds["sparse"] == 4


def test_cache_does_not_keep_layouts_alive(no_launches):
    fn = af.compile(af.attention(af.block_sparse(16)))
    q, k, v = tiny(requires_grad=True)
    (layout,) = layouts(1)
    fn(q, k, v, block_layout=layout).sum().backward()
    ref = weakref.ref(layout)
    del layout
    gc.collect()
    assert ref() is None


def test_cached_plan_still_rejects_bad_calls(no_launches):
    fn = af.compile(af.attention(af.block_sparse(16)))
    q, k, v = tiny()
    (layout,) = layouts(1)
    fn(q, k, v, block_layout=layout)
    with pytest.raises(ArgumentError, match="block_layout must have shape"):
        fn(q, k, v, block_layout=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ArgumentError, match="block_layout must be a bool"):
        fn(q, k, v, block_layout=layout.to(torch.uint8))
    with pytest.raises(ArgumentError, match="needs block_layout"):
        fn(q, k, v)
    fn(q, k, v, block_layout=layout)  # the cached layout still works
    # A layout whose metadata changed in place (same object) is checked again.
    layout.resize_(3, 4)
    with pytest.raises(ArgumentError, match="block_layout must have shape"):
        fn(q, k, v, block_layout=layout)

    rope = af.compile(af.attention(af.rope(), af.causal()))
    positions = torch.arange(64)
    rope(q, k, v, q_positions=positions, k_positions=positions)
    with pytest.raises(ArgumentError, match="q_positions must lie in"):
        rope(q, k, v, q_positions=positions + 2**24, k_positions=positions)
    with pytest.raises(ArgumentError, match="q_positions must have shape"):
        rope(q, k, v, q_positions=positions[:10], k_positions=positions)
    bias_fn = af.compile(af.attention(af.additive_bias()))
    bias = torch.zeros(1, 2, 64, 64)
    bias_fn(q, k, v, bias=bias)
    with pytest.raises(ArgumentError, match="does not broadcast"):
        bias_fn(q, k, v, bias=torch.zeros(3, 64, 64))
    with pytest.raises(ArgumentError, match="bias must be float16"):
        bias_fn(q, k, v, bias=bias.double())


@pytest.mark.interpreter
def test_alternating_layouts_give_each_its_own_result():
    """Cached lists are the right ones: layouts alternating (and one changed in place between
    two calls) match the float64 reference, the output and the gradients (fp32: 1e-4 max abs,
    2e-4 relative, as test_backward)."""
    spec = af.attention(af.block_sparse(16))
    fn = af.compile(spec)
    q, k, v = tiny(requires_grad=True, n=48)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))
    first, second = layouts(2, blocks=3)

    def check(layout):
        out = fn(q, k, v, block_layout=layout)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad_out)
        ref = reference_attention(spec, q.detach(), k.detach(), v.detach(), block_layout=layout)
        assert_close_to_reference(out.detach(), ref, q.dtype)
        expected = reference_gradients(spec, q, k, v, grad_out, block_layout=layout)
        errors = gradient_errors({"q": dq, "k": dk, "v": dv}, expected)
        assert max(errors.values()) <= 2e-4, errors

    for layout in (first, second, first, second):
        check(layout)
    first[1, 0] = not first[1, 0]
    check(first)


def test_layout_changed_before_backward_is_refused(no_launches):
    fn = af.compile(af.attention(af.block_sparse(16)))
    q, k, v = tiny(requires_grad=True)
    (layout,) = layouts(1)
    out = fn(q, k, v, block_layout=layout)
    layout[0, 1] = not layout[0, 1]
    with pytest.raises(ArgumentError, match="block_layout was modified in place"):
        out.sum().backward()


def test_more_layouts_than_kept_evict_the_oldest(builds, no_launches):
    fn = af.compile(af.attention(af.block_sparse(16)))
    q, k, v = tiny()
    many = layouts(TENSORS_PER_PLAN + 1)
    for layout in many:
        fn(q, k, v, block_layout=layout)
    assert builds["sparse"] == TENSORS_PER_PLAN + 1
    fn(q, k, v, block_layout=many[-1])  # kept
    assert builds["sparse"] == TENSORS_PER_PLAN + 1
    fn(q, k, v, block_layout=many[0])  # the oldest: evicted by the last
    assert builds["sparse"] == TENSORS_PER_PLAN + 2
    (plan,) = fn._plans.values()
    assert len(plan.layouts) == TENSORS_PER_PLAN
    del many, layout
    gc.collect()
    assert len(plan.layouts) == 0  # freed layouts' lists go with them


def test_positions_are_range_checked_once_per_tensor(monkeypatch, no_launches):
    """The largest |position| (a reduction and a device sync) is found once per positions
    tensor and version; a positions tensor changed in place is checked again."""
    reductions = []
    extent = call_binding.position_extent
    monkeypatch.setattr(call_binding, "position_extent", lambda t, name: reductions.append(name) or extent(t, name))
    fn = af.compile(af.attention(af.rope(), af.causal()))
    q, k, v = tiny(requires_grad=True)
    positions = torch.arange(64)
    for _ in range(3):
        fn(q, k, v, q_positions=positions, k_positions=positions).sum().backward()
    assert reductions == ["q_positions"]  # one tensor, passed for both
    positions[5] = 2**24 + 1  # in place: the cached range no longer holds
    with pytest.raises(ArgumentError, match="q_positions must lie in"):
        fn(q, k, v, q_positions=positions, k_positions=positions)
    with pytest.raises(ArgumentError, match="q_positions must lie in"):
        fn(q, k, v, q_positions=positions, k_positions=positions)
    positions[5] = 5
    fn(q, k, v, q_positions=positions, k_positions=positions.clone())
    assert reductions == ["q_positions"] + ["q_positions"] * 3 + ["k_positions"]


def test_positions_written_unseen_past_the_table_are_clamped_to_it():
    """A write PyTorch does not see (`.data`) can put a call-time position past the rotation
    table the runtime sized for the positions it read: the kernels clamp the table row
    (docs/robustness.md, known gaps), so such a position rotates as the table's last row, never
    by memory past it. Every other row is unaffected."""
    spec = af.attention(af.rope(theta=100.0), af.causal())
    fn = af.compile(spec)
    q, k, v = make_qkv(1, 2, 2, nq=16, nk=16, d=16, dtype=torch.float32)
    positions = torch.arange(16)
    fn(q, k, v, q_positions=positions, k_positions=positions)
    (plan,) = fn._plans.values()
    last = plan.constants["rope_table"].shape[1] - 1
    positions.data[3] = 10**6  # no version bump: the cached range still says 16
    out = fn(q, k, v, q_positions=positions, k_positions=positions)
    clamped = torch.arange(16)
    clamped[3] = last
    ref = reference_attention(spec, *(t.double() for t in (q, k, v)), q_positions=clamped, k_positions=clamped)
    assert_close_to_reference(out, ref, torch.float32)


def test_inference_tensors_are_not_cached_and_still_correct(builds):
    """Tensors made under `torch.inference_mode()` have no version counter: their lists are
    built per call (a write to them bumps nothing), and the call works."""
    fn = af.compile(af.attention(af.document(), af.causal()))
    q, k, v = tiny(n=40)
    with torch.inference_mode():
        ids = torch.tensor([0] * 15 + [1] * 20 + [-1] * 5)
    for _ in range(2):
        out = fn(q, k, v, doc_ids=ids)
    assert builds["sparse"] == 2
    ref = reference_attention(fn.spec, *(t.double() for t in (q, k, v)), doc_ids=ids)
    assert_close_to_reference(out, ref, torch.float32)


def test_doc_ids_changed_between_forward_and_backward_are_refused():
    fn = af.compile(af.attention(af.document(), af.causal()))
    q, k, v = tiny(requires_grad=True, n=40)
    ids = torch.tensor([0] * 15 + [1] * 25)
    out = fn(q, k, v, doc_ids=ids)
    ids[:5] = 1
    with pytest.raises(ArgumentError, match="doc_ids was modified in place"):
        out.sum().backward()


def test_a_variant_without_call_data_still_rejects_data_it_does_not_read(no_launches):
    """A call of a variant that binds nothing skips binding (`CallPlan.binds_nothing`) only
    when it passes nothing: given data is still refused, after a cached plan too."""
    fn = af.compile(af.attention(af.causal()))
    q, k, v = tiny()
    fn(q, k, v)
    assert fn.plan(q, k, v).binds_nothing
    with pytest.raises(ArgumentError, match="bias= given, but"):
        fn(q, k, v, bias=torch.zeros(1, 2, 64, 64))
    with pytest.raises(ArgumentError, match="block_layout= given, but"):
        fn(q, k, v, block_layout=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ArgumentError, match="q_positions= given, but"):
        fn(q, k, v, q_positions=torch.arange(64))
    bias_fn = af.compile(af.attention(af.additive_bias()))
    bias_fn(q, k, v, bias=torch.zeros(1, 2, 64, 64))
    assert not bias_fn.plan(q, k, v).binds_nothing
    with pytest.raises(ArgumentError, match="needs bias= at call time"):
        bias_fn(q, k, v)


@pytest.mark.interpreter
def test_a_returned_lse_is_never_the_scratch_of_later_calls():
    """Inference calls that discard the log-sum-exp store it into one scratch buffer per plan
    (`CallPlan.scratch`); an lse a call returns is its own, unchanged by later calls."""
    fn = af.compile(af.attention(af.causal()))
    q, k, v = tiny(n=32)
    with torch.no_grad():
        fn(q, k, v)  # makes the scratch
        out, lse = fn(q, k, v, return_lse=True)
        kept = lse.clone()
        for scale in (2.0, 3.0):
            fn(q * scale, k, v)  # writes the scratch with other values
    assert torch.equal(lse, kept)
    scratch = fn.plan(q, k, v).scratch["lse"]
    assert scratch.data_ptr() != lse.data_ptr()
    expected = reference_attention(af.attention(af.causal()), q, k, v, return_lse=True)[1]
    assert torch.allclose(lse.double(), expected.double(), atol=1e-4)


def test_direct_apply_is_used_exactly_where_the_preamble_is_the_known_one(monkeypatch):
    """`api.apply_attention` is the direct C apply iff this torch's `Function.apply` has the
    preamble it reproduces (`direct_apply.EXPECTED_PREAMBLE`); a torch whose preamble differs
    (or has no source) gets `Function.apply`. The CI's torch (2.13) has the known preamble."""
    supported = direct_apply.direct_apply_supported()
    assert attention_autograd.DIRECT_APPLY == supported
    assert (api.apply_attention is attention_autograd._apply_direct) == supported
    if torch.__version__.startswith("2.13"):
        assert supported
    code = direct_apply.function_apply_code()
    changed = [line.replace("unwrap_dead_wrappers", "unwrap_and_check") for line in code]
    monkeypatch.setattr(direct_apply, "function_apply_code", lambda: changed)
    assert not direct_apply.direct_apply_supported()
    monkeypatch.setattr(direct_apply, "function_apply_code", lambda: None)
    assert not direct_apply.direct_apply_supported()
    assert attention_autograd._AttentionFunction.setup_context is torch.autograd.Function.setup_context


@pytest.mark.interpreter
@pytest.mark.parametrize("spec", ["causal", "bias"])
def test_direct_apply_and_function_apply_give_equal_gradients(monkeypatch, spec):
    """Both ways of making the autograd node run the same kernels: equal outputs and
    gradients (bitwise), each near the float64 reference."""
    blocks = af.causal() if spec == "causal" else af.additive_bias()
    fn = af.compile(af.attention(blocks))
    q0, k0, v0 = tiny(n=32)
    bias0 = torch.randn(1, 2, 32, 32, generator=torch.Generator().manual_seed(3)).to(q0.dtype)
    grad_out = torch.randn(q0.shape, generator=torch.Generator().manual_seed(4)).to(q0.dtype)
    results = []
    for apply in (attention_autograd._apply_direct, attention_autograd._AttentionFunction.apply):
        monkeypatch.setattr(api, "apply_attention", apply)
        q, k, v, bias = (t.clone().requires_grad_(True) for t in (q0, k0, v0, bias0))
        extra = {"bias": bias} if spec == "bias" else {}
        out = fn(q, k, v, **extra)
        assert type(out.grad_fn).__name__ == "_AttentionFunctionBackward"
        out.backward(grad_out)
        grads = [q.grad, k.grad, v.grad] + ([bias.grad] if spec == "bias" else [])
        results.append([out.detach(), *grads])
    for direct, python in zip(*results):
        assert torch.equal(direct, python)
    q, k, v = (t.double() for t in (q0, k0, v0))
    extra = {"bias": bias0.double()} if spec == "bias" else {}
    expected = reference_attention(af.attention(blocks), q, k, v, **extra)
    assert torch.allclose(results[0][0].double(), expected, atol=2e-3)


def test_training_call_builds_an_attention_node(no_launches):
    """A training call's output hangs off `_AttentionFunction`'s node (the direct C apply),
    whose backward the engine runs."""
    fn = af.compile(af.attention(af.causal()))
    q, k, v = tiny(requires_grad=True)
    out = fn(q, k, v)
    assert type(out.grad_fn).__name__ == "_AttentionFunctionBackward"
    out.backward(torch.ones_like(out))
    assert q.grad is not None and q.grad.shape == q.shape
    assert no_launches == ["attention_fwd", "attention_bwd_dq_delta", "attention_bwd_dkdv"]


def test_training_call_under_functorch_takes_the_transform_node(no_launches, monkeypatch):
    """Under a functorch transform the call makes `_AttentionUnderTransform`'s node (the form
    functorch takes), never the direct C apply; it launches the same kernels
    (`test_functorch.py` checks its numbers)."""
    fn = af.compile(af.attention(af.causal()))
    q, k, v = tiny()
    monkeypatch.setattr(api, "apply_attention", lambda *a: pytest.fail("the direct apply under a transform"))
    torch.func.grad(lambda q: fn(q, k, v).float().sum())(q)
    assert no_launches == ["attention_fwd", "attention_bwd_dq_delta", "attention_bwd_dkdv"]
