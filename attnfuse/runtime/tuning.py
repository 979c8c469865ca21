"""Tuning files: tile configurations measured on the user's own GPU (`attnfuse-tune`), which the
dispatcher prefers to its built-in rules.

`choose_tile_config` (config.py) carries rules measured on the H200; every other GPU gets
untuned defaults. `attnfuse-tune` sweeps the portable kernels' tiles for one variant, shape and
dtype on the GPU at hand and writes what it measured best into a JSON file; naming that file
in `ATTNFUSE_TUNING` (several: separated by the OS path separator) makes every call that
matches an entry run with the entry's tiles:

- the same GPU (its name as `torch.cuda.get_device_name` gives it), dtype, head dim (and
  value head dim), and variant (its canonical attn program, `CompiledAttention.variant.text`);
- of the entries that match, the one whose query length is nearest the call's (by ratio), for
  the forward's fields and, separately, for the backward's.

An entry never overrides a configuration the user passed (`af.compile(..., config=)`), and the
tiles a block-sparse layout's block size bounds stay bounded (`CallPlanning.tile_config`). The
files are read when a compiled object plans a shape (once per shape: an object keeps its plans,
so a changed file reaches the objects compiled after the change, and the shapes an existing
object had not run yet); read again whenever `ATTNFUSE_TUNING` or a file's modification time
changes. A file that cannot be read, or whose entries are malformed, is an `ArgumentError`
naming the file and the entry.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from attnfuse.errors import ArgumentError
from attnfuse.runtime.config import TileConfig
from attnfuse.runtime.inputs import MAX_HEAD_DIM, Problem
from attnfuse.transforms.lower_to_tile import MAX_BLOCK, NUM_WARPS

TUNING_ENV = "ATTNFUSE_TUNING"
"""The environment variable naming the tuning files (`os.pathsep`-separated)."""

FORMAT = "attnfuse-tuning/1"
"""The `format` field of a tuning file this module reads (and `attnfuse-tune` writes)."""

KINDS = {
    "forward": ("block_m", "block_n", "num_warps", "num_stages"),
    "backward": ("bwd_block_m", "bwd_block_n", "bwd_num_warps", "bwd_num_stages"),
    "dkdv": ("dkdv_block_m", "dkdv_block_n", "dkdv_num_warps", "dkdv_num_stages"),
}
"""What an entry tunes (its `kind`) and the `TileConfig` fields it sets: the forward kernel,
the backward's dQ side (the preprocess and dQ kernels, `bwd_*`), and the dK/dV kernel."""

MAX_STAGES = 8
"""The deepest software pipeline an entry may name (Triton's pipeliner takes a few stages; a
larger count cannot fit shared memory, and would fail inside Triton without naming the file)."""

MAX_SEQUENCE = 2**31 - 1
"""The longest sequence an entry may name (an int32 position)."""

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
"""Dtype names as tuning files spell them."""


@dataclass(frozen=True)
class TuningEntry:
    """One measured best configuration: `kind` (a key of `KINDS`) for `variant` (canonical attn
    program text) at head dims `head_dim`/`head_dim_v`, `dtype`, query length `seq_q` and key
    length `seq_k`, on the GPU named `device`; `config` maps the kind's fields to values."""

    device: str
    variant: str
    dtype: str
    head_dim: int
    head_dim_v: int
    seq_q: int
    seq_k: int
    kind: str
    config: Mapping[str, int]

    def as_json(self) -> dict[str, Any]:
        """The entry as a tuning file holds it."""
        return {f.name: (dict(self.config) if f.name == "config" else getattr(self, f.name))
                for f in fields(self)}


def dtype_name(dtype: torch.dtype) -> str:
    """A dtype as tuning files name it."""
    for name, known in DTYPES.items():
        if known == dtype:
            return name
    raise ArgumentError(f"tuning: no tuning-file name for dtype {dtype}")


def parse_entry(raw: object, where: str) -> TuningEntry:
    """A `TuningEntry` from its JSON form, checked; `where` names it in errors."""
    if not isinstance(raw, dict):
        raise ArgumentError(f"{where}: an entry must be a JSON object, got {type(raw).__name__}")
    names = [f.name for f in fields(TuningEntry)]
    missing = [name for name in names if name not in raw]
    unknown = sorted(set(raw) - set(names))
    if missing or unknown:
        what = "; ".join(part for part in (missing and f"missing {', '.join(missing)}",
                                           unknown and f"unknown {', '.join(unknown)}") if part)
        raise ArgumentError(f"{where}: {what}")
    for name in ("device", "variant", "dtype", "kind"):
        if not isinstance(raw[name], str):
            raise ArgumentError(f"{where}: {name} must be a string, got {raw[name]!r}")
    for name, most in (("head_dim", MAX_HEAD_DIM), ("head_dim_v", MAX_HEAD_DIM),
                       ("seq_q", MAX_SEQUENCE), ("seq_k", MAX_SEQUENCE)):
        if not _positive_int(raw[name]) or raw[name] > most:
            raise ArgumentError(f"{where}: {name} must be an integer in [1, {most}], got {raw[name]!r}")
    if raw["dtype"] not in DTYPES:
        raise ArgumentError(f"{where}: dtype must be one of {', '.join(DTYPES)}, got {raw['dtype']!r}")
    if raw["kind"] not in KINDS:
        raise ArgumentError(f"{where}: kind must be one of {', '.join(KINDS)}, got {raw['kind']!r}")
    config = raw["config"]
    expected = KINDS[raw["kind"]]
    if not isinstance(config, dict) or sorted(config) != sorted(expected):
        raise ArgumentError(f"{where}: a {raw['kind']} entry's config has exactly "
                            f"{', '.join(expected)}, got {config!r}")
    for name, value in config.items():
        # The ranges lower-to-tile takes (its options' checks), so that an entry the file
        # check passes never fails later without naming the file.
        if not _positive_int(value):
            raise ArgumentError(f"{where}: config {name} must be a positive integer, got {value!r}")
        if name.endswith(("block_m", "block_n")) and not (value & (value - 1) == 0 and 16 <= value <= MAX_BLOCK):
            raise ArgumentError(f"{where}: config {name} must be a power of two in [16, {MAX_BLOCK}], got {value}")
        if name.endswith("num_stages") and value > MAX_STAGES:
            raise ArgumentError(f"{where}: config {name} must be in [1, {MAX_STAGES}], got {value}")
        if name.endswith("num_warps") and value not in NUM_WARPS:
            raise ArgumentError(f"{where}: config {name} must be one of {', '.join(map(str, NUM_WARPS))}, "
                                f"got {value}")
    return TuningEntry(**{**raw, "config": dict(config)})


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def read_file(path: str) -> list[TuningEntry]:
    """The entries of one tuning file, checked (`ArgumentError` naming the file otherwise)."""
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except (OSError, ValueError, RecursionError) as err:
        # ValueError: not JSON, not UTF-8, or a number past Python's digit limit;
        # RecursionError: nested deeper than the decoder goes.
        raise ArgumentError(f"{TUNING_ENV}: cannot read tuning file {path}: {type(err).__name__}: "
                            f"{str(err)[:200]}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ArgumentError(f"{TUNING_ENV}: {path} is not a tuning file: its \"format\" must be "
                            f"{FORMAT!r} (attnfuse-tune writes them)")
    entries = document.get("entries")
    if not isinstance(entries, list):
        raise ArgumentError(f"{path}: \"entries\" must be a list")
    return [parse_entry(raw, f"{path}: entry {i}") for i, raw in enumerate(entries)]


def write_file(path: str, entries: Iterable[TuningEntry], metadata: Mapping[str, Any] | None = None) -> None:
    """Writes a tuning file holding `entries` (and `metadata`, which readers ignore)."""
    document = {"format": FORMAT, "metadata": dict(metadata or {}),
                "entries": [entry.as_json() for entry in entries]}
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)  # whole or not at all: a reader never sees half a file


def merged(old: Iterable[TuningEntry], new: Iterable[TuningEntry]) -> list[TuningEntry]:
    """`old` with the entries of `new` added, each replacing an old one measured for the same
    GPU, variant, dtype, head dims, lengths and kind."""
    def key(entry: TuningEntry) -> tuple:
        return (entry.device, entry.variant, entry.dtype, entry.head_dim, entry.head_dim_v,
                entry.seq_q, entry.seq_k, entry.kind)
    table = {key(entry): entry for entry in old}
    table.update((key(entry), entry) for entry in new)
    return list(table.values())


_loaded: tuple[tuple, list[TuningEntry]] | None = None
"""The entries of the files `ATTNFUSE_TUNING` named when last read, with what they were read
from (the variable's value and each file's modification time)."""


def loaded_entries() -> list[TuningEntry]:
    """The entries of every file `ATTNFUSE_TUNING` names (none if it is unset or empty)."""
    global _loaded
    value = os.environ.get(TUNING_ENV, "")
    paths = [path for path in value.split(os.pathsep) if path]
    if not paths:
        return []
    try:
        stamp = (value, tuple(os.stat(path).st_mtime_ns for path in paths))
    except OSError as err:
        raise ArgumentError(f"{TUNING_ENV}: cannot read tuning file {err.filename}: {err.strerror}") from None
    if _loaded is None or _loaded[0] != stamp:
        _loaded = (stamp, [entry for path in paths for entry in read_file(path)])
    return _loaded[1]


def device_name(device: torch.device) -> str:
    """The GPU's name as tuning entries record it (`torch.cuda.get_device_name`), or "cpu"."""
    if device.type != "cuda":
        return device.type
    return torch.cuda.get_device_name(device)


def tuned_fields(problem: Problem, variant_text: str, device: str | None = None) -> dict[str, int]:
    """The `TileConfig` fields the loaded tuning entries set for a call of `problem` with the
    variant whose canonical text is `variant_text`, on the GPU named `device` (default: the
    problem's): per kind, the matching entry nearest the call's query length; {} when none
    matches."""
    entries = loaded_entries()
    if not entries:
        return {}
    name = device if device is not None else device_name(problem.device)
    dtype = dtype_name(problem.dtype)
    found: dict[str, int] = {}
    for kind in KINDS:
        candidates = [entry for entry in entries
                      if entry.kind == kind and entry.device == name and entry.dtype == dtype
                      and entry.head_dim == problem.head_dim and entry.head_dim_v == problem.head_dim_v
                      and entry.variant == variant_text]
        if candidates:
            # The nearest length by ratio; ties to the longer (measured at the larger size).
            best = min(candidates, key=lambda entry: (abs(math.log2(entry.seq_q / max(problem.seq_q, 1))),
                                                      -entry.seq_q))
            found.update(best.config)
    return found


def tuned_config(config: TileConfig, problem: Problem, variant_text: str) -> tuple[TileConfig, bool]:
    """`config` (the dispatcher's) with the loaded entries' fields for this call set
    (`tuned_fields`), and whether an entry set the forward's. A dQ-side entry without a dK/dV
    one keeps the dispatcher's dK/dV tiles: the tuner measured the dQ side with them (a None
    `dkdv_*` field would follow the tuned `bwd_*` ones)."""
    tuned = tuned_fields(problem, variant_text)
    if not tuned:
        return config, False
    if KINDS["backward"][0] in tuned and KINDS["dkdv"][0] not in tuned:
        tuned |= dict(zip(KINDS["dkdv"], config.dkdv()))
    return replace(config, **tuned), KINDS["forward"][0] in tuned
