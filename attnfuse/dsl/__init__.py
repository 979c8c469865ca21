"""The DSL: the block protocol, the core blocks and `attention(...)`, which composes blocks.

The other blocks are defined in `attnfuse/blocks/` (each with its op and meaning) and exported
from the `attnfuse` package.
"""

from attnfuse.dsl.blocks import llama3_scaling, rope, scaled_dot_product
from attnfuse.dsl.spec import AttentionSpec, attention

__all__ = ["AttentionSpec", "attention", "llama3_scaling", "rope", "scaled_dot_product"]
