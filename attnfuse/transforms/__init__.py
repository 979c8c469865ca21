"""The four passes, each a rewrite-pattern pipeline, registered under their pipeline names."""

from collections.abc import Callable

from xdsl.passes import ModulePass


def _canonicalize_attn() -> type[ModulePass]:
    from attnfuse.transforms.canonicalize_attn import CanonicalizeAttnPass

    return CanonicalizeAttnPass


def _analyze_masks() -> type[ModulePass]:
    from attnfuse.transforms.analyze_masks import AnalyzeMasksPass

    return AnalyzeMasksPass


def _place_rope() -> type[ModulePass]:
    from attnfuse.transforms.place_rope import PlaceRopePass

    return PlaceRopePass


def _lower_to_tile() -> type[ModulePass]:
    from attnfuse.transforms.lower_to_tile import LowerToTilePass

    return LowerToTilePass


PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "canonicalize-attn": _canonicalize_attn,
    "analyze-masks": _analyze_masks,
    "place-rope": _place_rope,
    "lower-to-tile": _lower_to_tile,
}
"""Pass factories by pipeline name, in pipeline order."""

DEFAULT_PIPELINE = "canonicalize-attn,analyze-masks,place-rope,lower-to-tile"
"""The full pipeline from the DSL's attn program to tile kernels."""
