"""`attnfuse-opt`: parse attn/tile IR, run a pass pipeline, print IR or Triton source.

    attnfuse-opt variant.mlir -p canonicalize-attn,analyze-masks,place-rope,lower-to-tile
    attnfuse-opt variant.mlir -p ... -t triton

A thin layer over xDSL's opt main: it registers AttnFuse's dialects, passes and targets
(`mlir`, the default, `triton` and `gluon`), reads MLIR text from a file of any name or from
stdin (no file, or `-`), and turns every failure into one located line on stderr
(`file:line:col: error: ...`) and exit code 1, never a Python traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib.util
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, Any, NoReturn
import io

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.utils.exceptions import (
    ArgSpecParseError,
    DiagnosticException,
    ParseError,
    PassFailedException,
    VerifyException,
)
from xdsl.utils.lexer import Input, Span
from xdsl.utils.mlir_lexer import MLIRTokenKind
from xdsl.xdsl_opt_main import xDSLOptMain

from attnfuse.blocks import unregistered_op_hint
from attnfuse.dialects import dialects
from attnfuse.dialects.diagnostics import OpLocatingParser, first_line, innermost_failing_op, location_of
from attnfuse.errors import AttnFuseError, PassOptionError
from attnfuse.transforms import PASSES


class LocatingParser(OpLocatingParser):
    """A parser that remembers where each operation starts, for located diagnostics (and,
    as `OpLocatingParser`, locates constraints that fail while an op is parsed)."""

    def __init__(self, ctx: Context, text: str, name: str, locations: dict[int, Span],
                 locate_verify_errors: bool = True):
        super().__init__(ctx, text, name, locations)
        self.locate_verify_errors = locate_verify_errors

    def parse_operation(self) -> Operation:
        if self.locate_verify_errors:
            return super().parse_operation()
        # --verify-diagnostics prints verifier messages as xDSL does.
        span = self._current_token.span
        op = Parser.parse_operation(self)
        self.locations[id(op)] = span
        return op

    def _parse_block(self):
        # xDSL reports anything that is neither an operation nor `}` where a region's ops
        # end as a missing block label (" in block definition"): say what was found.
        token = self._current_token
        if token.kind != MLIRTokenKind.CARET_IDENT:
            found = "the end of the input" if token.kind == MLIRTokenKind.EOF else f"'{token.text}'"
            self.raise_error(f"expected an operation or '}}' closing the region, got {found}", token.span)
        return super()._parse_block()


class AttnFuseOptMain(xDSLOptMain):
    """xDSL's opt main with AttnFuse's dialects, passes and targets registered."""

    def __init__(self, args: Sequence[str] | None = None):
        self.locations: dict[int, Span] = {}
        self.modules: list[ModuleOp] = []
        # Out-of-tree block modules join the attn dialect before xDSL registers it (which it
        # does before parsing the arguments).
        argv = list(args if args is not None else sys.argv[1:])
        self.argv = argv
        loaded = _option_values(argv, "--block-module")
        seen: set[Path] = set()
        for path in loaded:
            if Path(path).resolve() not in seen:  # the same file named twice is loaded once
                seen.add(Path(path).resolve())
                load_block_module(path)
        for target in _option_values(argv, "--target", "-t")[-1:]:
            _parse_target(target)  # before xDSL does, which would blame the pass pipeline
        super().__init__(description="AttnFuse modular optimizer driver", args=args)
        if list(self.args.block_module) != loaded:
            # argparse read a block module the scan above did not (a spelling it does not know).
            raise BlockModuleError("--block-module: write it as --block-module FILE or --block-module=FILE (this "
                                   "spelling is read too late to register the block)")
        spec = _parse_target(self.args.target)
        try:
            # The target's options, checked now: a bad one is the command line's mistake.
            self.available_targets[spec.name]().from_spec(spec)
        except Exception as err:  # noqa: BLE001 - xDSL raises ValueError and others
            raise CommandLineError(f"-t {self.args.target}: {first_line(err)}") from err

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        super().register_all_arguments(arg_parser)
        # A command-line mistake is one line and exit code 1, as every other failure is, not
        # argparse's usage text and exit code 2 (`--help` still prints the usage).
        arg_parser.error = _refuse_argument  # type: ignore[method-assign]
        arg_parser.add_argument(
            "--block-module", action="append", default=[], metavar="FILE.py",
            help="a block defined outside the package (docs/architecture.md §10.1): its OPS join "
                 "the attn dialect, as attnfuse.blocks.register_block_module does (repeatable)")

    def register_all_dialects(self) -> None:
        for dialect in dialects():
            self.ctx.register_dialect(dialect.name, lambda d=dialect: d)

    def register_all_passes(self) -> None:
        for name, factory in PASSES.items():
            self.register_pass(name, factory)

    def get_input_stream(self) -> tuple[IO[bytes], str]:
        """The input and its format: MLIR text, from the named file whatever its extension
        (xDSL picks a frontend by extension and refuses others), or from stdin when no file
        or `-` is named."""
        if self.args.input_file in (None, "-"):
            self.args.input_file = None
            return io.BytesIO(sys.stdin.buffer.read()), "mlir"
        return open(self.args.input_file, "rb"), "mlir"

    def register_all_targets(self) -> None:
        # Only the targets that print AttnFuse IR: xDSL's others (llvm, wgsl, csl, ...) print
        # nothing or fail on attn and tile ops.
        def mlir_target():
            from xdsl.targets.mlir import MLIRTarget

            return MLIRTarget

        self.available_targets["mlir"] = mlir_target

        def triton_target():
            from attnfuse.lowering.triton import TritonTarget

            return TritonTarget

        self.available_targets["triton"] = triton_target

        def gluon_target():
            from attnfuse.lowering.gluon import GluonTarget

            return GluonTarget

        self.available_targets["gluon"] = gluon_target

    def parse_chunk(self, chunk: IO[bytes], file_extension: str, start_offset: int = 0) -> ModuleOp | None:
        raw = chunk.read()
        try:
            text = raw.decode()
        except UnicodeDecodeError as err:
            # Located at the byte's line and column in the file (a chunk's byte offset would
            # count from the chunk's start).
            before = raw[:err.start].decode()
            line = before.count("\n") + 1
            col = len(before) - (before.rfind("\n") + 1) + 1
            raise ParseError(_span_at(before + " ", line, col, self.get_input_name(), start_offset),
                             f"input is not utf-8 text ({err.reason}: byte 0x{raw[err.start]:02x})") from None
        oversized = _oversized_integer(text)
        if oversized is not None:
            # xDSL would build the type (gigabytes for i4294967296) or fail converting the
            # literal (Python's digit limit) far from where the number stands.
            line, col, message = oversized
            raise ParseError(_span_at(text, line, col, self.get_input_name(), start_offset), message)
        unterminated = _unterminated_string(text)
        if unterminated is not None:
            # xDSL's lexer backtracks exponentially on an unclosed string: refuse it first.
            line, col = unterminated
            raise ParseError(
                _span_at(text, line, col, self.get_input_name(), start_offset),
                "unterminated string literal (strings end on the line they start)",
            )
        if not re.sub(r"//[^\n]*", "", text).strip():
            # Nothing but comments and whitespace: an empty module, as mlir-opt prints.
            module = ModuleOp([])
            self.modules.append(module)
            return module
        # Pad with the lines before this chunk so that locations count from the file's start.
        parser = LocatingParser(self.ctx, "\n" * start_offset + text, self.get_input_name(), self.locations,
                                locate_verify_errors=not self.args.verify_diagnostics)
        try:
            module = parser.parse_module()
        except ParseError as err:
            undefined = re.match(r"values used but not defined: \[(%[^\],]+)", err.msg)
            use = undefined and _first_use(text, undefined.group(1))
            if not use:
                raise
            # xDSL reports a value never defined at the end of the input: point at its first use.
            line = text.count("\n", 0, use.start()) + 1
            col = use.start() - (text.rfind("\n", 0, use.start()) + 1) + 1
            raise ParseError(_span_at(text, line, col, self.get_input_name(), start_offset),
                             f"{undefined.group(1)} is used but never defined") from err
        self.modules.append(module)
        return module

    def run(self) -> None:
        """xDSL's run, except that with `--split-input-file` a failing chunk is reported (one
        diagnostic line, as `main` reports errors) and the next chunks still run, as mlir-opt
        does; `ChunksFailed` at the end if any failed. Diagnostic-verifying, parsing-diagnostic
        and shrinking runs keep xDSL's own loop."""
        a = self.args
        if not a.split_input_file or a.verify_diagnostics or a.parsing_diagnostics or a.shrink:
            super().run()
            return
        chunks, file_extension = self.prepare_input()
        output = self.prepare_output()
        failed = False
        try:
            for i, (chunk, offset) in enumerate(chunks):
                # A chunk's error is looked for in its own module only (`failing_op`).
                self.modules = []
                try:
                    if i > 0:
                        output.write("// -----\n")
                    module = self.parse_chunk(chunk, file_extension, offset)
                    if module is not None:
                        self.apply_passes(module)
                        output.write(self.output_resulting_program(module))
                    output.flush()
                except Exception as err:  # noqa: BLE001 - reported, then the next chunk
                    output.flush()
                    print(diagnostic(self, self.argv, err), file=sys.stderr)
                    failed = True
                finally:
                    chunk.close()
        finally:
            if output is not sys.stdout:
                output.close()
        if failed:
            raise ChunksFailed

    def locate(self, op: Operation | None) -> str:
        """`file:line:col` of an op, or of the input when the op was not parsed from it."""
        return location_of(op, self.locations) or f"{self.get_input_name()}:1:1"

    def failing_op(self) -> tuple[Operation | None, str] | None:
        """The innermost op whose own verifier fails, and its message (`innermost_failing_op`)."""
        return innermost_failing_op(self.modules)


def _option_values(argv: Sequence[str], long: str, short: str | None = None) -> list[str]:
    """The values given to an option in `argv`, in order, as argparse reads them: `--name X`,
    `--name=X`, an unambiguous abbreviation of `--name` (the caller's to trust), `-s X`, `-sX`,
    `-s=X`; none after `--` (file names follow) and none when help is asked for. What must be
    read before argparse runs (a block module registers the dialect argparse's tool builds;
    a target's syntax is the command line's mistake, not the pipeline's)."""
    values: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg in ("-h", "--help"):
            return []
        name, equals, value = arg.partition("=")
        following = argv[i + 1] if i + 1 < len(argv) else None
        if arg.startswith("--") and len(name) > 3 and long.startswith(name):
            if equals:
                values.append(value)
            elif following is not None:
                values.append(following)
        elif short is not None and arg == short:
            if following is not None:
                values.append(following)
        elif short is not None and arg.startswith(short) and not arg.startswith("--"):
            rest = arg[len(short):]
            values.append(rest[1:] if rest.startswith("=") else rest)
    return values


class CommandLineError(AttnFuseError):
    """A mistake in the command line itself (not in the IR nor in the pass pipeline):
    reported as `attnfuse-opt: error: ...`."""


class BlockModuleError(CommandLineError):
    """A `--block-module` file that does not load."""


def _parse_target(text: str):
    """`text` parsed as a target spec (`name{options}`), or a `CommandLineError` naming it."""
    from xdsl.utils.arg_spec import parse_spec

    try:
        return parse_spec(text)
    except ArgSpecParseError as err:
        # xDSL's message quotes the text with a caret under the column: keep the column and words.
        located = re.match(r".*:1:(\d+) .*\^\s+(.*)$", " ".join(str(err).split()))
        detail = f"column {located.group(1)}: {located.group(2)}" if located else first_line(err)
        raise CommandLineError(f"-t {text}: {detail}") from err
    except Exception as err:  # noqa: BLE001 - xDSL's spec parser raises several kinds
        raise CommandLineError(f"-t {text}: {first_line(err)}") from err


def load_block_module(path: str) -> ModuleType:
    """Imports the block module at `path` and registers it (`attnfuse.blocks.
    register_block_module`); an `AttnFuseError` naming the file if it cannot. A file this
    process has already imported (a sibling block module's `import` of it) is that module,
    registered, not a second copy: two copies would define each op twice."""
    file = Path(path)
    if not file.exists():
        raise BlockModuleError(f"--block-module {path}: no such file")
    if not file.is_file():
        raise BlockModuleError(f"--block-module {path}: not a Python file")
    resolved = file.resolve()
    loaded = _module_loaded_from(resolved)
    if loaded is not None:
        return _register_loaded(loaded, path)
    directory = str(resolved.parent)
    added = directory not in sys.path
    if added:
        # As `python FILE` finds the modules beside FILE, so a block split over two files
        # loads; appended, not first, so a file there never shadows a module the tool imports.
        sys.path.append(directory)
    try:
        # The name `import <stem>` would load this very file under (so that a sibling block
        # module importing it later gets this module), else a name of its own: a block file
        # named json.py must not replace the json module, nor two block.py files each other.
        # Dataclasses and the compile cache look a module up by name.
        # (The file's own name: a link to it is imported as what it links to, as its
        # siblings, beside the target, import it.)
        stem = resolved.stem
        name = stem if _import_finds(stem, resolved) else (
            f"attnfuse_block_module_{stem}_{hashlib.sha256(str(resolved).encode()).hexdigest()[:12]}")
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise BlockModuleError(f"--block-module {path}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        _exec_block_module(spec, module, name, path)
        try:
            _register_loaded(module, path)
        except BlockModuleError:
            sys.modules.pop(name, None)
            raise
    except BaseException:
        if added:
            sys.path.remove(directory)  # a module that did not load leaves nothing behind
        raise
    return module


def _module_loaded_from(file: Path) -> ModuleType | None:
    """The module in `sys.modules` whose source is `file` (resolved), if any."""
    for module in list(sys.modules.values()):
        source = getattr(module, "__file__", None)
        if isinstance(source, str) and Path(source).name == file.name:
            with contextlib.suppress(OSError):
                if Path(source).resolve() == file:
                    return module
    return None


def _register_loaded(module: ModuleType, path: str) -> ModuleType:
    """`module`, already imported, registered as a block module (`load_block_module`)."""
    from attnfuse.blocks import block_module_problem, register_block_module

    problem = block_module_problem(module)
    if problem is not None:
        raise BlockModuleError(f"--block-module {path}: {problem}")
    register_block_module(module)
    return module


def _import_finds(name: str, file: Path) -> bool:
    """Whether `import name` would load `file` (resolved): a free top-level name whose
    search along `sys.path` ends at this file."""
    if not name.isidentifier() or name in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    origin = None if spec is None else spec.origin
    if not isinstance(origin, str):
        return False
    with contextlib.suppress(OSError):
        return Path(origin).resolve() == file
    return False


def _exec_block_module(spec: Any, module: ModuleType, name: str, path: str) -> None:
    """Runs the block module's code; any failure is a `BlockModuleError` naming the file (the
    module taken out of `sys.modules`), but the user's Ctrl-C."""
    try:
        spec.loader.exec_module(module)
    except SystemExit as err:
        # A module that exits while imported (a script's sys.exit, argparse's usage error) is
        # a module that does not load, not the tool's own exit.
        sys.modules.pop(name, None)
        raise BlockModuleError(f"--block-module {path}: the module called sys.exit({err.code!r}) while "
                               "being imported") from None
    except KeyboardInterrupt:
        sys.modules.pop(name, None)
        raise  # the user's Ctrl-C, the tool's to end with
    except BaseException as err:  # noqa: BLE001 - a user's module: one line, never a traceback
        # BaseException, not Exception: a module may raise its own BaseException subclass
        # (or GeneratorExit); it is still a module that does not load.
        sys.modules.pop(name, None)
        raise BlockModuleError(f"--block-module {path}: {type(err).__name__}: {first_line(err)}") from err


MAX_INTEGER_WIDTH = (1 << 24) - 1
"""The widest integer type MLIR allows (`IntegerType::kMaxWidth`)."""

MAX_LITERAL_DIGITS = 4000
"""The most digits an integer literal may have: below Python's default limit for converting
text to an int (4300, `sys.set_int_max_str_digits`)."""

_INTEGER_TYPE = re.compile(r"(?:(?<=[\d?*\]]x)|(?<![\w%@#$.!^]))[su]?i(\d+)\b")
"""An integer type: alone (`i32`, `si8`) or as a shaped type's element (`tensor<2xi32>`,
`tensor<?xi32>`, `tensor<*xi32>`, `vector<[4]xi32>`)."""

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_LONG_LITERAL = re.compile(r"(?<![\w.])\d{%d,}" % (MAX_LITERAL_DIGITS + 1))


def _oversized_integer(text: str) -> tuple[int, int, str] | None:
    """(line, column, message) of the first integer type wider than MLIR allows, or integer
    literal longer than `MAX_LITERAL_DIGITS`, outside comments; None if there is none."""
    for number, line_text in enumerate(text.split("\n"), start=1):
        # Outside strings (blanked, so that columns stay) and comments.
        code = _STRING.sub(lambda m: " " * len(m.group(0)), line_text).split("//", 1)[0]
        for match in _INTEGER_TYPE.finditer(code):
            digits = match.group(1)
            if len(digits) > len(str(MAX_INTEGER_WIDTH)) or int(digits) > MAX_INTEGER_WIDTH:
                return (number, match.start() + 1,
                        f"integer type {match.group(0)[:24]} is wider than {MAX_INTEGER_WIDTH} bits, "
                        "MLIR's limit")
        literal = _LONG_LITERAL.search(code)
        if literal is not None:
            return (number, literal.start() + 1,
                    f"integer literal of {len(literal.group(0))} digits: at most {MAX_LITERAL_DIGITS}")
    return None


def _unterminated_string(text: str) -> tuple[int, int] | None:
    """(line, column), 1-based, of a string literal that its line does not close, if any.
    MLIR strings cannot span lines; `//` outside a string starts a comment."""
    for number, line in enumerate(text.split("\n"), start=1):
        start, i = None, 0
        while i < len(line):
            c = line[i]
            if start is None:
                if line.startswith("//", i):
                    break
                if c == '"':
                    start = i
            elif c == "\\":
                i += 1  # the escaped character
            elif c == '"':
                start = None
            i += 1
        if start is not None:
            return number, start + 1
    return None


def _first_use(text: str, name: str) -> re.Match | None:
    """The first place `name` (`%x`) is read in `text`: outside comments and strings, not a
    prefix of a longer name, and not where a value of that name is defined (`%x =`, `%x:2 =`,
    or an argument `%x :`)."""
    # Comments and strings blanked out, positions kept.
    code = re.sub(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*', lambda m: " " * len(m.group(0)), text)
    return re.search(re.escape(name) + r"(?![\w.$-])(?!\s*(?::\d+\s*)?[=:])", code)


def _span_at(text: str, line: int, col: int, name: str, start_offset: int) -> Span:
    """A one-character span at (line, col) of a chunk that starts `start_offset` lines in."""
    lines = text.split("\n")
    position = sum(len(lines[i]) + 1 for i in range(line - 1)) + col - 1
    padded = "\n" * start_offset + text
    position += start_offset
    return Span(position, position + 1, Input(padded, name))


def _pipeline_error(argv: Sequence[str], message: str, option: tuple[str, str] | None = None) -> str:
    """`-p:1:col: error: ...`, pointing into the pipeline argument: at the value the message
    quotes, else at `option` (pass, option: a `PassOptionError`'s) inside that pass's braces
    (else at the pass)."""
    pipeline = ""
    for i, arg in enumerate(argv):
        if arg in ("-p", "--passes") and i + 1 < len(argv):
            pipeline = argv[i + 1]
        elif arg.startswith("--passes="):
            pipeline = arg.split("=", 1)[1]
    col = 1
    located = re.match(r"Error parsing pass pipeline specification: pass-pipeline:1:(\d+) .*\^\s+(.*)$", message)
    if located:
        # xDSL's own message quotes the pipeline with a caret under the column: keep the
        # column and the words, drop the copy of the pipeline.
        return f"<pass-pipeline>:1:{located.group(1)}: error: {located.group(2).strip()}"
    quoted = re.search(r"'([^']+)'", message)
    at = None
    if option is not None and option[0] in pipeline:
        start = pipeline.index(option[0])
        # The option itself, not a longer one ending the same way (bwd-block-n for block-n).
        at = re.compile(r"(?<=[{\s,])" + re.escape(option[1]) + "=").search(pipeline, start)
        col = (at.start() if at else start) + 1
    if quoted:
        # The value the message quotes: after its option when that is known (the same text
        # may appear earlier, in another pass's name: `analyze-masks,...{bwd-rope=as}`).
        value = pipeline.find(quoted.group(1), at.end() if at else 0)
        if value >= 0:
            col = value + 1
    return f"<pass-pipeline>:1:{col}: error: {message}"


def _option_of(err: BaseException) -> tuple[str, str] | None:
    """(pass, option) of a `PassOptionError`, raised itself or as the cause of xDSL's error."""
    while err is not None:
        if isinstance(err, PassOptionError):
            return err.pass_name, err.option
        err = err.__cause__ or err.__context__
    return None


class ChunksFailed(Exception):
    """Some chunks of a `--split-input-file` run failed; each was reported where it failed."""


def diagnostic(tool: AttnFuseOptMain, argv: Sequence[str], err: BaseException) -> str:
    """The one line `attnfuse-opt` prints for an error raised while it parses, verifies,
    transforms or prints a chunk: located at the IR (or at the pass pipeline for an option),
    never a traceback."""
    if isinstance(err, ParseError):
        # Chunks are parsed with their preceding lines padded in, so the span's own line is
        # already the file's: drop the offset xDSL adds for --split-input-file.
        location = dataclasses.replace(err.span, line_offset=0).get_location()
        return f"{location}: error: {err.msg}{unregistered_op_hint(err.msg, 'load its file with --block-module FILE')}"
    if isinstance(err, (VerifyException, DiagnosticException)):
        # An error that names its op (a use before its definition) is located there.
        culprit = getattr(err, "op", None)
        found = (culprit, first_line(err)) if culprit is not None else tool.failing_op()
        op, message = found if found is not None else (None, first_line(err))
        return f"{tool.locate(op)}: error: {message}"
    if isinstance(err, PassOptionError):
        return _pipeline_error(argv, str(err), _option_of(err))
    if isinstance(err, (PassFailedException, AttnFuseError)):
        op = getattr(err, "op", None)
        found = tool.failing_op() if op is None else None
        if found is not None:
            op, message = found
        else:
            message = first_line(err)
        return f"{tool.locate(op)}: error: {message}"
    if isinstance(err, OSError):
        return f"attnfuse-opt: error: {err}"
    if isinstance(err, UnicodeDecodeError):
        return (f"{tool.get_input_name()}:1:1: error: input is not utf-8 text "
                f"({err.reason} at byte {err.start})")
    if isinstance(err, RecursionError):
        return (f"{tool.get_input_name()}:1:1: error: the input nests too deeply for the parser "
                f"(Python's recursion limit, {sys.getrecursionlimit()})")
    # A compiler bug: still one located line, never a traceback.
    found = tool.failing_op()
    op = found[0] if found is not None else None
    return f"{tool.locate(op)}: error: internal compiler error: {type(err).__name__}: {first_line(err)}"


def _refuse_argument(message: str) -> NoReturn:
    """argparse's error hook: its message, as a `CommandLineError`."""
    raise CommandLineError(message)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the tool; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        tool = AttnFuseOptMain(args=argv)
    except SystemExit as exit_:  # --help: argparse printed the usage and exits 0
        return int(exit_.code or 0)
    except CommandLineError as err:
        print(f"attnfuse-opt: error: {first_line(err)}", file=sys.stderr)
        return 1
    except (ArgSpecParseError, ValueError, PassFailedException) as err:
        message = str(err).strip().replace("\n", " ")
        print(_pipeline_error(argv, message, _option_of(err)), file=sys.stderr)
        return 1
    try:
        tool.run()
    except ChunksFailed:
        return 1
    except Exception as err:  # noqa: BLE001 - every error is one diagnostic line
        print(diagnostic(tool, argv, err), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["AttnFuseOptMain", "main"]
