"""Instructions per review, counted by valgrind's callgrind: the engine bench's reviews
(`benches/engine.rs`, Job mode and Pod mode), each against the `IgnoredAny` scan of the same
bytes. A count does not move with the machine's load, so a change of a few percent shows here
on a day when `cargo bench --bench engine`'s times cannot tell it from the noise. It is not a
time: the engine's branchy code runs fewer instructions per cycle than the scan's tight loop,
so its time ratio is higher than its instruction ratio (benches/README.md gives both).

    python3 benches/instructions.py                      # builds the engine bench, counts it
    python3 benches/instructions.py before=/tmp/engine-old after=target/release/deps/engine-…
    python3 benches/instructions.py --cache              # with simulated L1i misses, mispredictions

Each binary is an engine bench executable (`cargo bench --bench engine --no-run` prints its
path); with several, they are counted in the order given. Needs valgrind (Debian: valgrind).
The count per call is the inclusive cost of every call of `evi::review::handle` (the engine)
and of `serde_json::de::from_trait` (the scan), over the iterations criterion runs in
`--profile-time` seconds: the number of iterations does not matter.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODES = {"job": "job-mode-4047B", "pod": "pod-mode-4262B"}
ENGINE = r"evi::review::handle$"
SCAN = r"serde_json::de::from_trait$"


# The cache and branch models of `--cache`: this machine's AMD EPYC L1 (32 KiB, 8-way, 64-byte
# lines) and L2 (512 KiB per core); callgrind's "last level" stands for the L2 here.
CACHES = ["--cache-sim=yes", "--branch-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64",
          "--LL=524288,8,64"]
# The columns `--cache` prints: callgrind's event, and what the table calls it.
SIMULATED = {"Ir": "instructions", "I1mr": "L1i misses", "Bcm": "branch mispredictions",
             "Bim": "indirect mispredictions"}


def per_call(out: pathlib.Path, callee: str) -> tuple[int, dict[str, float]]:
    """Calls of functions matching `callee` and their inclusive cost per call of each event
    recorded (`Ir`, the instructions, always), summed over every call site in a callgrind output
    file (names compressed as `(id) name`)."""
    names: dict[str, str] = {}
    calls = 0
    events: list[str] = []
    positions = 1
    totals: list[int] = []
    pattern = re.compile(callee)
    current = ""
    lines = out.read_text(errors="replace").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?$", line)
        if m:
            if m.group(3):
                names[m.group(2)] = m.group(3)
            if m.group(1) == "cfn":
                current = names.get(m.group(2), "")
        elif line.startswith("events:"):
            events = line.split(":", 1)[1].split()
            totals = [0] * len(events)
        elif line.startswith("positions:"):
            positions = len(line.split(":", 1)[1].split())
        elif line.startswith("calls=") and pattern.search(current):
            calls += int(line.split("=", 1)[1].split()[0])
            costs = lines[i + 1].split()[positions:]
            for k, c in enumerate(costs):
                totals[k] += int(c)
            i += 2
            continue
        i += 1
    if calls == 0:
        raise SystemExit(f"{out}: no call of {callee} (a symbol renamed or inlined?)")
    return calls, {e: t / calls for e, t in zip(events, totals, strict=True)}


def count(binary: str, bench: str, callee: str, seconds: float,
          cache: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "callgrind.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             *(CACHES if cache else []), binary, "--bench", "--profile-time", str(seconds), bench],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        return per_call(out, callee)[1]


def build() -> str:
    msgs = subprocess.run(
        ["cargo", "bench", "--bench", "engine", "--no-run", "--message-format", "json"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    for line in msgs.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "engine" \
                and msg.get("executable"):
            return msg["executable"]
    raise SystemExit("cargo built no engine bench executable")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binaries", nargs="*", help="label=path of engine bench executables")
    ap.add_argument("--seconds", type=float, default=1.0, help="criterion's --profile-time")
    ap.add_argument("--cache", action="store_true",
                    help="also simulate this machine's caches and branch predictor (valgrind's "
                         "models: fewer calls in the same --seconds): L1i misses and "
                         "mispredictions per call")
    args = ap.parse_args()
    binaries = [b.split("=", 1) if "=" in b else [b, b] for b in args.binaries] or [
        ["this tree", build()]]
    if args.cache:
        heads = [f"{side}: {name}" for name in SIMULATED.values() for side in ("scan", "engine")]
        print("| binary | review | " + " | ".join(heads) + " |")
        print("|---|---|" + "---|" * len(heads))
    else:
        print("| binary | review | scan: instructions | engine: instructions | ratio |")
        print("|---|---|---|---|---|")
    for label, path in binaries:
        for mode, group in MODES.items():
            scan = count(path, f"{group}/baseline", SCAN, args.seconds, args.cache)
            engine = count(path, f"{group}/engine", ENGINE, args.seconds, args.cache)
            if args.cache:
                cells = [f"{side[e]:,.0f}" for e in SIMULATED for side in (scan, engine)]
                print(f"| {label} | {mode} mode | " + " | ".join(cells) + " |")
            else:
                print(f"| {label} | {mode} mode | {scan['Ir']:,.0f} | {engine['Ir']:,.0f} | "
                      f"{engine['Ir'] / scan['Ir']:.3f} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
