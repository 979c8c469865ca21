// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64 block-m=64 block-n=64}' | filecheck %s --check-prefix=TILE
// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64 backward=false block-m=64 block-n=64}' -t triton | filecheck %s --check-prefix=PRINT
// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64 backward=false block-m=128 block-n=128},warp-specialize' | filecheck %s --check-prefix=SCHEDULED
// RUN: attnfuse-opt %S/../inputs/sparse-causal.mlir -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64 backward=false block-m=64 block-n=64}' -t triton | filecheck %s --check-prefix=BLOCK-MAJOR
// RUN: attnfuse-opt %S/../inputs/documents.mlir -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64 backward=false block-m=64 block-n=64}' -t triton | filecheck %s --check-prefix=BLOCK-MAJOR
// A block-sparse forward walks its lists on a head-major grid (`head_major = 1`): one grid
// axis, program p owning block p % blocks (from the end, under descending order) of batch x
// head p // blocks, so the programs running at once are neighbouring blocks of a few heads and
// share their keys and values in L2. The backward's listed kernels, a block-sparse forward
// under a band (whose longest programs go first on the block-major grid) and a document
// forward keep the block-major grid (unmeasured), and a warp-specialized forward walks its own
// (warp-specialize drops the attribute).

// TILE:       tile.kernel @attention_fwd({{.*}}) attributes {{{.*}}block_order = #tile<order descending>, head_major = 1 : i64}
// TILE:       tile.kernel @attention_bwd_dq_delta(
// TILE-NOT:   head_major
// TILE:       tile.kernel @attention_bwd_dkdv(
// TILE-NOT:   head_major

// PRINT:      def attention_fwd(
// PRINT:          # Program grid (one program per (batch x query head, query block)).
// PRINT-NEXT:     num_blocks = tl.cdiv(n_q, BLOCK_M)
// PRINT-NEXT:     batch_head = tl.program_id(0) // num_blocks
// PRINT-NEXT:     block_id = num_blocks - 1 - tl.program_id(0) % num_blocks
// PRINT-NEXT:     batch = (batch_head // num_heads).to(tl.int64)

// SCHEDULED:  tile.kernel @attention_fwd(
// SCHEDULED-SAME: schedule = #tile<schedule warp_specialized>
// SCHEDULED-NOT: head_major

// BLOCK-MAJOR-NOT: head_major
// BLOCK-MAJOR:     def attention_fwd(
// BLOCK-MAJOR:         block_id = tl.num_programs(1) - 1 - tl.program_id(1)
// BLOCK-MAJOR-NEXT:    batch_head = tl.program_id(0)
attn.variant @sparse(%q : !attn.query, %k : !attn.key, %v : !attn.value, %layout : !attn.layout) -> !attn.output {
  %s = attn.scores %q, %k
  %l = attn.block_sparse %s, %layout {block_size = 128 : i64}
  %p = attn.softmax %l
  %o = attn.pv %p, %v
  attn.yield %o
}
