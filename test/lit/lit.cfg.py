# lit configuration for AttnFuse's FileCheck tests: `lit -v test/lit`.
import os

import lit.formats

config.name = "AttnFuse"
config.test_format = lit.formats.ShTest()
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["lit.cfg.py", "inputs"]
# Tools come from the active environment (pip install -e .[test]).
config.environment["PATH"] = os.environ.get("PATH", "")
for var in ("HOME", "ATTNFUSE_CACHE_DIR", "TRITON_INTERPRET", "PYTHONPATH"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
# Round trip through the generic form: print generic, parse it back, print custom.
config.substitutions.append(
    ("%roundtrip", "attnfuse-opt --print-op-generic %s | attnfuse-opt")
)
