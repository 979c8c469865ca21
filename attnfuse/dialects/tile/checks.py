"""Checks shared by the tile ops' verifiers: tile shapes and element types, tensor roles, and
the ops that enclose an op (its loop, its kernel)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from xdsl.ir import (
    Operation,
    SSAValue,
)
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.tile.traits import (
    BlockLoop,
)
from attnfuse.dialects.tile.types import (
    TensorType,
    TileType,
    role_kind,
)

if TYPE_CHECKING:
    from attnfuse.dialects.tile.kernel import KernelOp


def expect_tile(value: SSAValue, what: str) -> TileType:
    if not isinstance(value.type, TileType):
        raise VerifyException(f"{what} must be a !tile.tile, got {value.type}")
    return value.type


def expect_shape(value: SSAValue, shape: tuple[str, ...], what: str) -> TileType:
    ty = expect_tile(value, what)
    if ty.shape != shape:
        raise VerifyException(
            f"{what} must be a {' x '.join(shape)} tile, got {' x '.join(ty.shape)}"
        )
    return ty



def expect_role(value: SSAValue, roles: str | tuple[str, ...], message: str) -> None:
    """Raises `message` unless `value` is a tensor bound to one of `roles`."""
    wanted = (roles,) if isinstance(roles, str) else roles
    if not isinstance(value.type, TensorType) or role_kind(value.type.role.data) not in wanted:
        raise VerifyException(message)


def enclosing_loop(op: Operation) -> Operation | None:
    """The innermost loop over blocks (an op with the `BlockLoop` trait: `tile.kv_loop`,
    `tile.sparse_kv_loop`, `tile.q_loop`, `tile.sparse_q_loop`) around `op`."""
    parent = op.parent_op()
    while parent is not None and not parent.has_trait(BlockLoop, value_if_unregistered=False):
        parent = parent.parent_op()
    return parent


def verify_loop_scores(op: Operation, scores: SSAValue, what: str) -> None:
    expect_shape(scores, ("m", "n"), what)
    if enclosing_loop(op) is None:
        raise VerifyException(f"{op.name} works on a key block: it belongs in a key loop")


def verify_f32_state(values: Sequence[tuple[SSAValue, tuple[str, ...], str]]) -> None:
    for value, shape, what in values:
        ty = expect_shape(value, shape, what)
        if ty.elem != "f32":
            raise VerifyException(f"{what} must be f32, got {ty.elem}")


def kernel_of(op: Operation) -> KernelOp | None:
    """The `tile.kernel` around `op`, if any and if its attributes can be read (else None:
    the kernel's verifier reports them, `KernelOp.header_problem`). Found by the op's name
    rather than its class: the kernel's module imports the ops (the split merges) whose
    verifiers call this."""
    parent = op.parent_op()
    while parent is not None and parent.name != "tile.kernel":
        parent = parent.parent_op()
    kernel = cast("KernelOp | None", parent)
    return kernel if kernel is not None and kernel.header_problem() is None else None
