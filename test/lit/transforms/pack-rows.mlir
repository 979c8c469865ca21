// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=fused key=fused},lower-to-tile{decode=true kv-lens=true head-dim=64 block-m=16 block-n=64},pack-rows' | filecheck %s
// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=fused key=pre_rotated},lower-to-tile{decode=true head-dim=64 block-m=16 block-n=64},pack-rows' | filecheck %s --check-prefix=ROTATED
// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=fused key=fused},lower-to-tile{decode=true kv-lens=true head-dim=64 block-m=16 block-n=64},pack-rows' -t triton | filecheck %s --check-prefix=TRITON
// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=fused key=fused},lower-to-tile{head-dim=64},pack-rows' | filecheck %s --check-prefix=PREFILL

// The split decode kernel streams the cache's key and value rows: their row strides may be
// the constant row widths. The merge reads no key rows.
// CHECK:       tile.kernel @attention_decode
// CHECK-SAME:    packed_rows = ["k", "v"]
// CHECK:       tile.kernel @attention_merge
// CHECK-NOT:     packed_rows
// A key rotated before the kernel is read as its rotated copy.
// ROTATED:     tile.kernel @attention_decode
// ROTATED-SAME:  packed_rows = ["k_rot", "v"]

// The Triton target binds them behind a constexpr the runtime sets per call, after the
// split kernel's pdl trigger and before anything reads them.
// TRITON-LABEL: def attention_decode(
// TRITON:       PACKED_ROWS: tl.constexpr = False,
// TRITON:       gdc_launch_dependents()
// TRITON-NEXT:  if PACKED_ROWS:
// TRITON-NEXT:      stride_k_n = HEAD_DIM
// TRITON-NEXT:      stride_v_n = HEAD_DIM_V
// TRITON-NEXT:  # Program grid
// TRITON-LABEL: def attention_merge(
// TRITON-NOT:   PACKED_ROWS

// Forward and backward kernels of a prefill keep their runtime strides.
// PREFILL-NOT: packed_rows
