"""Sums `perf script -F ip,sym` call stacks (benches/profile.sh) into categories: each sample
goes to the first category one of whose frames it contains, so nested work is counted once, in
the most specific category listed first. Prints each category's share and its top leaf frames.

    python3 benches/profile_summary.py perf.txt [--top 3]
"""

from __future__ import annotations

import argparse
import collections
import re

CATEGORIES = [  # (name, frames that mark it, |-separated), most specific first
    ("engine: decode the review", "serde_json::de::from_trait"),
    ("engine: decide", "evi::engine::decide_audited"),
    ("engine: encode the response", "evi::review::encode"),
    ("decision log line", "tracing_core::event::Event::dispatch"),
    ("handler: metrics, body, routing", "evi::server::webhook::review_at"),
    ("axum routing and middleware", "axum::routing::route::RouteFuture"),
    ("kernel: write (TLS records out, loopback delivery)", "__GI___writev"),
    ("HTTP/TLS read (hyper, rustls, kernel)", "poll_read"),
    ("TLS other (rustls)", "rustls::"),
    ("log writer thread", "log_writer::write_batches|tracing_appender::worker|crossbeam_channel"),
    ("epoll", "epoll_wait"),
]


def stacks(path: str):
    cur: list[str] = []
    for line in open(path, errors="replace"):
        line = line.strip()
        if not line:
            if cur:
                yield cur[::-1]
                cur = []
            continue
        parts = line.split(" ", 1)
        cur.append(parts[1] if len(parts) > 1 else parts[0])
    if cur:
        yield cur[::-1]


def short(frame: str) -> str:
    for _ in range(3):
        frame = re.sub(r"<[^<>]*>", "", frame)
    return frame[:90]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("perf_script")
    ap.add_argument("--top", type=int, default=3)
    args = ap.parse_args()
    counts: collections.Counter[str] = collections.Counter()
    leaves: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    total = 0
    for st in stacks(args.perf_script):
        total += 1
        joined = " ".join(st)
        name = next((n for n, markers in CATEGORIES if any(m in joined for m in markers.split("|"))), "other")
        counts[name] += 1
        leaves[name][short(st[-1])] += 1
    print(f"{total} samples")
    for name, n in counts.most_common():
        top = ", ".join(f"{leaf} {c / total * 100:.1f}%" for leaf, c in leaves[name].most_common(args.top))
        print(f"{n / total * 100:5.1f}%  {name}  [{top}]")


if __name__ == "__main__":
    main()
