// A --block-module file may import a module beside it by its plain name (the block split over
// two files): the file's directory is on the import path while the tool runs.
// RUN: attnfuse-opt --block-module %S/../inputs/sibling_import_block.py %s -p canonicalize-attn | filecheck %s
// Both files given, in either order (or one twice): one module per file, so the op is defined
// once, not once per copy.
// RUN: attnfuse-opt --block-module %S/../inputs/sibling_import_block.py --block-module %S/../inputs/no_vjp_block.py %s -p canonicalize-attn | filecheck %s
// RUN: attnfuse-opt --block-module %S/../inputs/no_vjp_block.py --block-module %S/../inputs/sibling_import_block.py %s -p canonicalize-attn | filecheck %s
// RUN: attnfuse-opt --block-module %S/../inputs/no_vjp_block.py --block-module %S/../inputs/no_vjp_block.py %s -p canonicalize-attn | filecheck %s
// A link to a file is that file (imported as its target's name, as its siblings import it).
// RUN: rm -rf %t && mkdir -p %t && ln -s %S/../inputs/no_vjp_block.py %t/square.py
// RUN: attnfuse-opt --block-module %t/square.py --block-module %S/../inputs/sibling_import_block.py %s -p canonicalize-attn | filecheck %s

// CHECK:      %sq = attn.square_scores %s
// CHECK-NEXT: %m = attn.mask %sq [#attn.causal]
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %sq = attn.square_scores %m
  %p = attn.softmax %sq
  %o = attn.pv %p, %v
  attn.yield %o
}
