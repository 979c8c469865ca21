"""Lowering out of the tile dialect: Triton source text."""
