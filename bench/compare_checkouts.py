#!/usr/bin/env python3
"""Time two checkouts of AttnFuse side by side in one run: is the candidate within 2% of main?

    python3 bench/compare_checkouts.py --baseline DIR --candidate DIR [--out FILE.md] [--rep MS] [--quick]

Each DIR is a source tree holding `attnfuse/` (a clone, or `git archive main attnfuse | tar -x -C
DIR`); nothing is installed. Each checkout gets one long-lived worker (this file with --worker, run
by `sys.executable` with DIR prepended to PYTHONPATH, which holds xDSL, and its own
ATTNFUSE_CACHE_DIR and TRITON_CACHE_DIR), spoken to one JSON line at a time over stdin/stdout.
Only the public API is used (`af.attention(...)`, `spec(q, k, v, bias=...)`, `out.backward(g)`).

Method (attnfuse-bench's: attnfuse/tools/bench.py, bench/README.md):
1. Correctness first: both workers run one small fwd+bwd problem per variant and geometry (N<=512,
   window N/4 so that it masks) on equal seeded inputs and torch.save out, dq, dk, dv; the parent
   reports max |candidate - baseline|.
2. Timing: per case, both workers build and compile (untimed, once), then rounds alternate
   baseline, candidate, baseline, ... (the first round dropped: it follows the compiles). A round is
   `triton.testing.do_bench(..., return_mode="median")` (CUDA events, L2 flushed, warmup/rep in
   ms); a checkout's time is the median of its rounds. `spread`, (max - min) / median of the
   rounds, shows how far single rounds moved; one slow round, often in both checkouts at once,
   dominates it and the median ignores it. The floor to judge a ratio by is an A/A run (baseline
   = candidate): on the H200, 20 GPU rows gave 0.983 to 1.007, so repeat a close call.
   The host-bound small call is timed as bench/host_overhead.py does: wall time per step, steps
   enqueued back to back. Both workers are pinned to one CPU core (see main()).
Without CUDA it only says so; --quick there runs one tiny case through TRITON_INTERPRET=1 to test
the protocol end to end (timings mean nothing).
"""

from __future__ import annotations

import argparse, gc, hashlib, json, math, os, shlex, statistics, subprocess, sys, tempfile, time  # noqa: E401
from pathlib import Path

VARIANTS = ("causal", "rope_causal", "window_causal", "alibi_causal", "bias_causal")


def geometry(name: str, B: int, Hq: int, Hkv: int, D: int, dtype: str, theta: float) -> dict:
    return {"geometry": name, "B": B, "Hq": Hq, "Hkv": Hkv, "D": D, "dtype": dtype, "theta": theta}


PAPER = geometry("B=4 H=12/12 D=64 fp16", 4, 12, 12, 64, "fp16", 1e4)
LLAMA = geometry("Llama-3-8B B=1 H=32/8 D=128 bf16", 1, 32, 8, 128, "bf16", 5e5)  # Llama 3's RoPE theta
HOST = geometry("host-bound B=1 H=8/8 D=64 fp16", 1, 8, 8, 64, "fp16", 1e4)
TINY = geometry("CPU interpreter B=1 H=2/2 D=16 fp32", 1, 2, 2, 16, "fp32", 1e4)


def build_cases(quick: bool, cuda: bool) -> list[dict]:
    """The timed cases, each a JSON-able dict that both workers rebuild identically."""
    cases = [{**PAPER, "variant": v, "N": n, "mode": "fwd"} for v in VARIANTS for n in (4096, 8192)]
    cases += [{**LLAMA, "variant": v, "N": 4096, "mode": m} for v in VARIANTS for m in ("fwd", "fwdbwd")]
    cases.append({**HOST, "variant": "causal", "N": 128, "mode": "fwdbwd", "timer": "host"})
    if quick:  # a GPU smoke test: one case of each geometry, timer and mode
        keep = {(PAPER["geometry"], "causal", "fwd", 4096), (LLAMA["geometry"], "rope_causal", "fwdbwd", 4096),
                (HOST["geometry"], "causal", "fwdbwd", 128)}
        cases = [c for c in cases if (c["geometry"], c["variant"], c["mode"], c["N"]) in keep]
    if not cuda:  # the interpreter is slow: one tiny case just exercises the protocol
        cases = [{**TINY, "variant": "causal", "N": 32, "mode": "fwdbwd", "timer": "host"}]
    return [{"timer": "bench", "window": 1024, "seed": 0, **c} for c in cases]


def check_problems(cases: list[dict]) -> dict[tuple, dict]:
    """One small fwd+bwd problem per (variant, geometry) among the cases, keyed by those two."""
    problems = {}
    for case in cases:
        n = min(case["N"], 512)
        problems.setdefault((case["variant"], case["geometry"]),
                            {**case, "B": 1, "N": n, "window": max(n // 4, 1), "mode": "fwdbwd"})
    return problems


# ---- Worker side: runs in the checkout's environment and imports *its* attnfuse. ----


def build(case: dict):
    """Inputs and the timed step of one case; returns (step, leaves whose .grad to reset)."""
    import torch
    import attnfuse as af

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[case["dtype"]]
    extra = {"causal": [], "rope_causal": [af.rope(theta=case["theta"])], "alibi_causal": [af.alibi()],
             "window_causal": [af.sliding_window(case["window"])], "bias_causal": [af.additive_bias()]}
    spec = af.attention(*extra[case["variant"]], af.causal())
    train = case["mode"] == "fwdbwd"
    torch.manual_seed(case["seed"])  # same seed, torch and device: both checkouts get equal inputs

    def draw(heads: int, grad: bool = train):
        return torch.randn(case["B"], heads, case["N"], case["D"], device=device, dtype=dtype).requires_grad_(grad)

    q, k, v, dout = draw(case["Hq"]), draw(case["Hkv"]), draw(case["Hkv"]), draw(case["Hq"], False)
    kwargs = {}
    if case["variant"] == "bias_causal":  # [1, Hq, N, N] in the inputs' dtype, no gradient, as attnfuse-bench
        kwargs["bias"] = torch.randn(1, case["Hq"], case["N"], case["N"], device=device, dtype=dtype)

    def step():
        with torch.set_grad_enabled(train):  # forward-only cases build no autograd graph
            out = spec(q, k, v, **kwargs)
            if train:
                out.backward(dout)
        return out

    return step, ([q, k, v] if train else [])


def _sync() -> None:
    """Wait for the GPU, so that host clocks see finished work."""
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def host_ms(step, leaves, warmup_ms: float, rep_ms: float, batches: int = 10) -> float:
    """Median over batches of the wall time per step, steps enqueued back to back."""
    def run(count: int) -> float:  # ms per step over `count` steps
        _sync()
        start = time.perf_counter()
        for _ in range(count):
            for leaf in leaves:  # as do_bench's grad_to_none: no gradient-accumulation adds
                leaf.grad = None
            step()
        _sync()
        return (time.perf_counter() - start) * 1e3 / count

    estimate = max(run(1), 1e-3)
    run(max(1, int(warmup_ms / estimate)))
    return statistics.median(run(max(1, int(rep_ms / batches / estimate))) for _ in range(batches))


def handle(request: dict, state: dict) -> dict:
    """Answer one request; `state` keeps the current case so that its rounds reuse one compile."""
    import torch

    op, case = request["op"], request.get("case")
    if op == "info":  # what runs here; the parent checks that attnfuse_file lies in the tree
        import attnfuse, triton  # noqa: E401
        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        return {"attnfuse_file": attnfuse.__file__, "torch": torch.__version__, "triton": triton.__version__,
                "python": sys.version.split()[0], "gpu": gpu}
    if op == "check":
        step, leaves = build(case)
        saved = {"out": step().detach().cpu()}  # .cpu() waits for the kernels
        saved.update({name: leaf.grad.cpu() for name, leaf in zip(("dq", "dk", "dv"), leaves)})
        torch.save(saved, request["path"])
        return {"ok": True}
    if op not in ("prepare", "time"):
        raise ValueError(f"unknown op {op!r}")
    key = json.dumps(case, sort_keys=True)
    if state.get("key") != key:  # a new case: free the last one's memory, then build and compile
        state.clear()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        step, leaves = build(case)
        step()  # compiles, and keeps first-call work out of every round
        _sync()
        state.update(key=key, step=step, leaves=leaves)
    if op == "prepare":
        return {"ok": True}
    step, leaves, warmup, rep = state["step"], state["leaves"], request["warmup"], request["rep"]
    if case["timer"] == "host" or not torch.cuda.is_available():
        return {"ms": host_ms(step, leaves, warmup, rep)}
    from triton.testing import do_bench
    return {"ms": float(do_bench(step, warmup=warmup, rep=rep, grad_to_none=leaves or None, return_mode="median"))}


def worker_main(cpu: int) -> int:
    """Serve requests, one JSON line in, one JSON line out, until "quit" or end of input."""
    if cpu >= 0:  # before torch starts threads, so that they all inherit it
        os.sched_setaffinity(0, {cpu})
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever else prints (Triton, warnings, the library) goes to stderr, off the protocol
    import torch  # noqa: F401 - before attnfuse, so that it picks GPU or interpreter early
    import attnfuse  # noqa: F401

    state: dict = {}
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "quit":
            break
        try:
            reply = handle(request, state)
        except Exception as err:  # noqa: BLE001 - one broken case must not end the run
            reply = {"error": f"{type(err).__name__}: {err}".replace("\n", " ")[:300]}
        protocol.write(json.dumps(reply) + "\n")
    return 0


# ---- Parent side: needs torch only to compare the saved outputs. ----


class Worker:
    """One checkout's worker process; restarted if it dies (a broken kernel can kill it)."""

    def __init__(self, label: str, tree: Path, scratch: Path, cuda: bool, cpu: int):
        self.label, env = label, dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH")) if p)
        env["ATTNFUSE_CACHE_DIR"] = str(scratch / label / "attnfuse")  # no compile cache shared
        env["TRITON_CACHE_DIR"] = str(scratch / label / "triton")
        if not cuda:
            env["TRITON_INTERPRET"] = "1"
        self.cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--cpu", str(cpu)]
        self.env, self.cwd = env, scratch  # cwd: no attnfuse/ in the caller's directory shadows the tree's
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=self.env, cwd=self.cwd)

    def ask(self, **request) -> dict:
        """Send one request and return the reply; a dead worker is restarted and answers an error."""
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if line:
            return json.loads(line)
        status = self.proc.wait()
        self.start()
        return {"error": f"{self.label} worker died (exit status {status}); restarted"}

    def close(self) -> None:
        try:
            self.proc.stdin.write('{"op": "quit"}\n')
            self.proc.stdin.close()
        except BrokenPipeError:  # it died already
            pass
        self.proc.wait(timeout=60)


def max_abs_diff(workers: dict[str, Worker], problem: dict, scratch: Path) -> tuple[str, bool]:
    """Both checkouts run `problem`: max |candidate - baseline| over out, dq, dk, dv, and whether
    that is a finite number (an error or a NaN fails the run)."""
    import torch
    paths = {label: scratch / f"check-{label}.pt" for label in workers}
    for label, worker in workers.items():
        if "error" in (reply := worker.ask(op="check", case=problem, path=str(paths[label]))):
            return f"{label} error: {reply['error']}", False
    base, cand = (torch.load(paths[label]) for label in ("baseline", "candidate"))
    if base.keys() != cand.keys() or any(base[n].shape != cand[n].shape for n in base):
        return "outputs of different names or shapes", False
    # torch's max keeps a NaN (Python's max() may drop it, depending on the order)
    worst = torch.stack([(cand[n].float() - base[n].float()).abs().max() for n in base]).max().item()
    return f"{worst:.3g}", math.isfinite(worst)


def time_case(workers: dict[str, Worker], case: dict, args) -> dict:
    """Compile in both, then interleaved rounds (baseline, candidate, ...), then medians."""
    for worker in workers.values():  # both compile first, so that no compile gap falls between rounds
        if "error" in (reply := worker.ask(op="prepare", case=case)):
            return {"error": reply["error"]}
    rounds: dict[str, list[float]] = {label: [] for label in workers}
    for index in range(args.rounds + 1):  # round 0 is dropped: it brings the clocks up after compiling
        for label, worker in workers.items():
            if "error" in (reply := worker.ask(op="time", case=case, warmup=args.warmup, rep=args.rep)):
                return {"error": reply["error"]}
            if index:
                rounds[label].append(reply["ms"])
    med = {label: statistics.median(times) for label, times in rounds.items()}
    spread = {label: (max(times) - min(times)) / med[label] for label, times in rounds.items()}
    return {"ms": med, "spread": spread, "ratio": med["candidate"] / med["baseline"], "rounds": rounds}


def describe_tree(tree: Path) -> str:
    """HEAD (-dirty) if `tree` is the top of a git tree, and the digest of its attnfuse sources."""
    def git(*argv: str) -> str:  # --no-optional-locks: never write the tree's index
        return subprocess.run(["git", "--no-optional-locks", "-C", str(tree), *argv], capture_output=True,
                              text=True, check=True).stdout.strip()
    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != tree:
            raise ValueError("inside another git tree")
        commit = git("rev-parse", "HEAD") + ("-dirty" if git("status", "--porcelain") else "")
    except (OSError, ValueError, subprocess.CalledProcessError):
        commit = "not a git tree"
    digest = hashlib.sha256()  # as attnfuse.tools.bench.source_digest: matches copies without .git
    for path in sorted((tree / "attnfuse").rglob("*.py")):
        digest.update(path.relative_to(tree / "attnfuse").as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{commit}, source digest {digest.hexdigest()[:16]}"


def report(args, info: dict, trees: dict, cases: list, results: list, diffs: dict, seconds: float) -> str:
    """The Markdown report: setup header, one table row per case, a summary."""
    timer = f"do_bench median (warmup {args.warmup:g} ms, rep {args.rep:g} ms)" if info["gpu"] else "wall clock"
    pinned = f"both workers pinned to CPU {args.cpu}" if args.cpu >= 0 else "workers not pinned"
    lines = ["# AttnFuse: candidate vs baseline", "",
             f"- GPU: {info['gpu'] or 'none (CPU, TRITON_INTERPRET=1; timings meaningless)'}",
             f"- torch {info['torch']}, triton {info['triton']}, python {info['python']}"]
    lines += [f"- {label}: `{tree}`: {describe_tree(tree)}" for label, tree in trees.items()]
    lines += [f"- timing: per case {args.rounds} rounds alternating baseline, candidate (after one dropped "
              f"round), each a {timer}; a checkout's time is the median of its rounds; spread = (max - min) "
              f"/ median of the rounds; host-bound rows: wall time per step enqueued back to back; {pinned}; "
              f"{seconds:.0f} s in all",
              "- max abs diff: max |candidate - baseline| over out, dq, dk, dv of a B=1, N<=512 fwd+bwd "
              "problem of the row's variant and geometry", "",
              "```", shlex.join(getattr(sys, "orig_argv", sys.argv)), "```", "",
              "| case | geometry | mode | N | baseline ms | candidate ms | cand/base | spread base / cand "
              "| max abs diff |", "|---|---|---|---|---|---|---|---|---|"]
    ratios: dict[str, list[float]] = {}
    for case, res in zip(cases, results):
        head = f"| {case['variant']} | {case['geometry']} | {case['mode']} | {case['N']} |"
        diff = diffs[case["variant"], case["geometry"]][0].replace("|", "/")
        if "error" in res:
            lines.append(f"{head} error | {res['error'].replace('|', '/')} | | | {diff} |")
            continue
        ratios.setdefault(case["timer"], []).append(res["ratio"])
        flag = " **slower**" if res["ratio"] > 1.02 else ""
        lines.append(f"{head} {res['ms']['baseline']:.4f} | {res['ms']['candidate']:.4f} | {res['ratio']:.3f}{flag} "
                     f"| {100 * res['spread']['baseline']:.1f}% / {100 * res['spread']['candidate']:.1f}% | {diff} |")
    lines.append("")
    for timer, name in (("bench", "GPU-timed"), ("host", "host-bound")):
        if found := ratios.get(timer):
            lines.append(f"- {name} rows: geometric mean of cand/base {statistics.geometric_mean(found):.3f}, "
                         f"worst {max(found):.3f}, {sum(r > 1.02 for r in found)} of {len(found)} above 1.02")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description="Time two AttnFuse checkouts side by side.")
    parser.add_argument("--baseline", type=Path, help="source tree holding attnfuse/ (e.g. main)")
    parser.add_argument("--candidate", type=Path, help="source tree holding attnfuse/ (the change)")
    parser.add_argument("--out", type=Path, help="also write the Markdown report here")
    parser.add_argument("--rep", type=float, default=100.0, help="do_bench rep per round, ms (default 100)")
    parser.add_argument("--warmup", type=float, default=25.0, help="do_bench warmup per round, ms (default 25)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per case and checkout (default 5)")
    parser.add_argument("--quick", action="store_true", help="a tiny subset, for a smoke test")
    parser.add_argument("--cpu", type=int, help="core both workers are pinned to (default: the last this "
                        "process may use; -1: none)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args.cpu)
    if args.cpu is None:
        # Unpinned, the host-bound row moved 30-50% between two identical workers on the H200
        # machine (cores differ, and the scheduler moves processes); pinned, ~3%. The workers share
        # the core (they never run at once), so neither gets a better one.
        args.cpu = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else -1
    if not (args.baseline and args.candidate):
        parser.error("--baseline and --candidate are required")
    trees = {"baseline": args.baseline.resolve(), "candidate": args.candidate.resolve()}
    for label, tree in trees.items():
        if not (tree / "attnfuse" / "__init__.py").is_file():
            parser.error(f"--{label} {tree}: no attnfuse/__init__.py there")

    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        print("compare_checkouts: no CUDA device; timings need an NVIDIA GPU.", file=sys.stderr)
        if not args.quick:
            return 2
        print("--quick: one tiny case through TRITON_INTERPRET=1, to test the protocol.", file=sys.stderr)
        args.rep, args.warmup = min(args.rep, 20.0), min(args.warmup, 5.0)
    cases, started = build_cases(args.quick, cuda), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attnfuse-compare-") as tmp:
        scratch = Path(tmp)
        workers = {label: Worker(label, tree, scratch, cuda, args.cpu) for label, tree in trees.items()}
        try:
            infos = {label: worker.ask(op="info") for label, worker in workers.items()}
            for label, found in infos.items():  # void if a worker imported some other attnfuse
                if "error" in found:
                    sys.exit(f"{label} worker could not start: {found['error']}")
                if trees[label] not in Path(found["attnfuse_file"]).resolve().parents:
                    sys.exit(f"{label} worker imported {found['attnfuse_file']}, not the one in {trees[label]}")
            diffs = {}
            for key, problem in check_problems(cases).items():
                diffs[key] = max_abs_diff(workers, problem, scratch)
                print(f"check {key[0]} [{key[1]}]: max abs diff {diffs[key][0]}", file=sys.stderr, flush=True)
            results = []
            for case in cases:
                results.append(time_case(workers, case, args))
                print(f"time {case['variant']} [{case['geometry']}] {case['mode']} N={case['N']}: "
                      f"{results[-1].get('rounds', results[-1].get('error'))}", file=sys.stderr, flush=True)
        finally:
            for worker in workers.values():
                worker.close()
    text = report(args, infos["baseline"], trees, cases, results, diffs, time.perf_counter() - started)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 1 if any("error" in r for r in results) or not all(ok for _, ok in diffs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
