"""Instructions per review for tests/complexity.rs's input families, counted by callgrind: what
catches work that allocates nothing (a scan of names against names), which the test's heap
counts cannot see. Each family's review at each of its sizes is run once, alone, in the test
binary (`EVI_COMPLEXITY_CASE=<family>:<step>`); only `evi::review::handle` is counted, not
the building of the input.

    python3 benches/complexity.py                  # every family, a table, the bounds checked
    python3 benches/complexity.py --family mounts  # one
    python3 benches/complexity.py --release        # the bench profile's build (slower to build)

Held to the same bounds as the test: each doubling at most 2.3x the instructions (scaled by
how much the review grew), and the largest input at most --per-kib times a Nextflow review's
instructions per KiB. Exits 1 naming each family past a bound. Needs valgrind (Debian:
valgrind).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
FAMILIES = ["json-long-key", "json-deep-values", "json-nested-values", "json-small-objects", "json-unknown-fields",
            "json-long-lists", "many-annotations", "many-volume-annotations", "near-miss-annotations",
            "prefix-length-keys", "volumes-x-containers", "containers", "mounts", "containers-list",
            "short-names-lists", "unknown-pairs", "huge-names", "job-update"]
STEPS = 5
MAX_RATIO = 2.3


def test_binary(release: bool) -> str:
    cmd = ["cargo", "test", "--locked", "--test", "complexity", "--no-run", "--message-format=json"]
    if release:
        cmd.insert(2, "--release")
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        m = json.loads(line)
        if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "complexity":
            return m["executable"]
    raise SystemExit("no complexity test binary was built")


def instructions(binary: str, case: str) -> tuple[int, int]:
    """(instructions in evi::review::handle, bytes of the review) for one case."""
    with tempfile.TemporaryDirectory() as d:
        out = pathlib.Path(d) / "callgrind.out"
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             "--toggle-collect=evi::review::handle*", binary, "--exact",
             "every_family_costs_at_most_linearly_more_as_its_input_doubles", "--nocapture"],
            env=dict(os.environ, EVI_COMPLEXITY_CASE=case), capture_output=True, text=True, check=True)
        size = re.search(r"(\d+) bytes in, \d+ out", run.stdout)
        if not size:
            raise SystemExit(f"{case}: the test printed no review size:\n{run.stdout}\n{run.stderr[-2000:]}")
        totals = [line for line in out.read_text().splitlines() if line.startswith(("totals:", "summary:"))]
        return int(totals[0].split()[1]), int(size.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", action="append", choices=FAMILIES, help="only these (repeatable)")
    ap.add_argument("--release", action="store_true", help="count the release-profile test build")
    ap.add_argument("--per-kib", type=float, default=8.0,
                    help="bound per KiB, a multiple of a Nextflow review's (default: %(default)s)")
    args = ap.parse_args()
    binary = test_binary(args.release)
    ordinary, ordinary_size = instructions(binary, "nextflow:0")
    ordinary_per_kib = ordinary / (ordinary_size / 1024)
    print(f"Nextflow review: {ordinary:,} instructions, {ordinary_size:,} bytes, "
          f"{ordinary_per_kib:,.0f} per KiB")
    print("| family | review bytes (first → last) | instructions (first → last) | worst doubling | "
          "per KiB, last (× Nextflow) |")
    print("|---|---|---|---|---|")
    failures = []
    for family in args.family or FAMILIES:
        counts = [instructions(binary, f"{family}:{step}") for step in range(STEPS + 1)]
        worst = max((b / a) / ((sb / sa) / 2) for (a, sa), (b, sb) in zip(counts, counts[1:], strict=False))
        last, last_size = counts[-1]
        per_kib = last / (last_size / 1024)
        bound = args.per_kib
        print(f"| {family} | {counts[0][1]:,} → {last_size:,} | {counts[0][0]:,} → {last:,} | "
              f"{worst:.2f} | {per_kib:,.0f} ({per_kib / ordinary_per_kib:.1f}×) |", flush=True)
        if worst > MAX_RATIO:
            failures.append(f"{family}: a doubling cost {worst:.2f}× the instructions")
        if per_kib > bound * ordinary_per_kib:
            failures.append(f"{family}: {per_kib / ordinary_per_kib:.1f}× a Nextflow review per KiB, "
                            f"more than {bound}×")
    for f in failures:
        print(f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
