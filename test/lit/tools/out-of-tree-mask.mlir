// RUN: attnfuse-opt --block-module %S/../../python/blocks/lookahead_block.py %s -p canonicalize-attn,analyze-masks | filecheck %s
// RUN: attnfuse-opt --block-module %S/../../python/blocks/lookahead_block.py %s -p canonicalize-attn,analyze-masks,place-rope,lower-to-tile | filecheck %s --check-prefix=TILE
// A band mask defined outside the package with no op of its own (lookahead_block.py: a mask
// predicate, #attn.lookahead<n>, listed in ATTRIBUTES): its attribute parses, analyze-masks
// intersects its band with the package's predicates, and the loops' bounds follow the band.

// CHECK-NOT:  Traceback
// CHECK:      attn.mask %{{.*}} [#attn.lookahead<3>, #attn.window<8>] {band = #attn.band<lower = -7, upper = 3>}
// TILE:       tile.kv_bounds {band = #attn.band<lower = -7, upper = 3>}
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.lookahead<3>, #attn.window<8>]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
