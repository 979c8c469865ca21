"""The passes, each a rewrite-pattern pipeline, registered under their pipeline names: four on
the attn dialect (the last lowers to tile), then two tile-to-tile passes that make decisions
the Triton target used to take itself visible in the tile IR."""

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


def _convert_attn_to_tile() -> type[ModulePass]:
    from attnfuse.transforms.lower_to_tile import ConvertAttnToTilePass

    return ConvertAttnToTilePass


def _fold_scale_into_exp() -> type[ModulePass]:
    from attnfuse.transforms.fold_scale_into_exp import FoldScaleIntoExpPass

    return FoldScaleIntoExpPass


def _share_offsets() -> type[ModulePass]:
    from attnfuse.transforms.share_offsets import ShareOffsetsPass

    return ShareOffsetsPass


def _warp_specialize() -> type[ModulePass]:
    from attnfuse.transforms.warp_specialize import WarpSpecializePass

    return WarpSpecializePass


PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "canonicalize-attn": _canonicalize_attn,
    "analyze-masks": _analyze_masks,
    "place-rope": _place_rope,
    "lower-to-tile": _lower_to_tile,
    "convert-attn-to-tile": _convert_attn_to_tile,
    "fold-scale-into-exp": _fold_scale_into_exp,
    "share-offsets": _share_offsets,
    "warp-specialize": _warp_specialize,
}
"""Pass factories by pipeline name, in pipeline order."""

TILE_PIPELINE = "fold-scale-into-exp,share-offsets"
"""The tile-to-tile passes every compile runs after lowering."""

DEFAULT_PIPELINE = f"canonicalize-attn,analyze-masks,place-rope,lower-to-tile,{TILE_PIPELINE}"
"""The full pipeline from the DSL's attn program to the tile kernels the Triton target prints."""
