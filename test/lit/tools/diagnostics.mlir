// attnfuse-opt reports every failure as one located line and exit code 1, no traceback.
// RUN: not attnfuse-opt %s -p canonicalize-attn,no-such-pass 2>&1 | filecheck %s --check-prefix=PASS
// RUN: not attnfuse-opt %s -p 'place-rope{query=sideways}' 2>&1 | filecheck %s --check-prefix=OPTION
// RUN: not attnfuse-opt %s -p 'place-rope{bogus=1}' 2>&1 | filecheck %s --check-prefix=UNKNOWN-OPTION
// RUN: not attnfuse-opt %s -p 'canonicalize-attn,,analyze-masks' 2>&1 | filecheck %s --check-prefix=PIPELINE
// RUN: not attnfuse-opt %s -p 'lower-to-tile{head-dim=64' 2>&1 | filecheck %s --check-prefix=PIPELINE-ARGS
// RUN: not attnfuse-opt %S/../inputs/typo.mlir 2>&1 | filecheck %s --check-prefix=PARSE
// RUN: not attnfuse-opt %S/../inputs/unverified.mlir 2>&1 | filecheck %s --check-prefix=VERIFY
// RUN: not attnfuse-opt %S/../inputs/split.mlir --split-input-file 2>&1 | filecheck %s --check-prefix=SPLIT

// PASS: <pass-pipeline>:1:19: error: Unrecognized passes: ['no-such-pass']
// PASS-NOT: Traceback
// OPTION: <pass-pipeline>:1:18: error: place-rope: query must be one of auto, fused, pre_rotated, got 'sideways'
// UNKNOWN-OPTION: <pass-pipeline>:1:1: error: Provided arguments ["bogus"] not found in expected arguments
// PIPELINE: <pass-pipeline>:1:19: error: Expected pass name here
// PIPELINE-ARGS: <pass-pipeline>:1:26: error: Malformed pass arguments, expected either a space or `}` here
// PARSE: typo.mlir:4:22: error: Operation attn.scorez is not registered
// PARSE-NOT: Traceback
// VERIFY: unverified.mlir:4:3: error: a variant needs exactly one normalizer, found 2
// SPLIT: split.mlir:13:18: error: Operation attn.nope is not registered
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
