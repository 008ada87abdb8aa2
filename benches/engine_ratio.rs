#![allow(clippy::unwrap_used)] // a benchmark: a broken fixture should stop it loudly
//! The engine's time against the `IgnoredAny` scan of the same review, **paired**: many short
//! rounds, each timing a batch of scans and a batch of reviews back to back (their order
//! alternating), and the ratio of each round kept. The engine bench (`benches/engine.rs`)
//! measures the two seconds apart, so on this shared machine, whose speed moves by tens of
//! percent within a minute, its ratio moves with the machine; here both halves of a round see
//! the same machine, and the median of thousands of rounds is steady. The goal (engine within
//! 2.0× of a scan) is read here; `cargo bench --bench engine_ratio` prints it.

use std::{
    hint::black_box,
    time::{Duration, Instant},
};

// The binary runs with mimalloc (src/main.rs); measure what it runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use evi::review;
use serde::de::IgnoredAny;

#[path = "../tests/common/mod.rs"]
mod common;

/// Calls per batch: a batch lasts ~50–200 µs, short against the machine's swings.
const BATCH: u32 = 25;
/// Rounds per review: ~1 s each.
const ROUNDS: usize = 4000;

fn timed(f: &mut impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..BATCH {
        f();
    }
    start.elapsed()
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    // `cargo bench` passes `--bench`; `-- --test` (a smoke run, as criterion's) runs a few rounds.
    let rounds = if std::env::args().any(|a| a == "--test") {
        10
    } else {
        ROUNDS
    };
    let cfg = common::test_config();
    println!("review | scan (median) | engine (median) | paired ratio: median [p25, p75]");
    // The third row is the floor every review pays: Pod mode's pod without its two volume
    // annotations (asking for nothing, as most of a cluster's pods), so the review is decoded
    // and answered but nothing is decided; what Pod mode costs above it is the decision.
    let mut asks_nothing = common::read_input("nextflow-pod-mode");
    asks_nothing["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations")
        .unwrap();
    let asks_nothing = serde_json::to_vec(&common::review_for(
        &asks_nothing,
        "nf",
        "705ab4f5-6393-11e8-b7cc-42010a800002",
    ))
    .unwrap();
    for (mode, body) in [
        ("job mode", common::pod_review_bytes("nextflow-job-mode")),
        ("pod mode", common::pod_review_bytes("nextflow-pod-mode")),
        ("pod mode, nothing asked", asks_nothing),
    ] {
        // What was decided, printed with the row (mutated, or unchanged for the floor).
        let decided = review::handle(&cfg, None, review::Endpoint::Mutate, &body)
            .unwrap()
            .decision
            .label();
        let mut scan = || {
            serde_json::from_slice::<IgnoredAny>(black_box(&body)).unwrap();
        };
        let mut engine = || {
            let handled = review::handle(
                black_box(&cfg),
                None,
                review::Endpoint::Mutate,
                black_box(&body),
            )
            .unwrap();
            black_box(handled);
        };
        // Warm-up: caches, the allocator's pages, the CPU's frequency.
        for _ in 0..200 {
            timed(&mut scan);
            timed(&mut engine);
        }
        let mut ratios = Vec::with_capacity(rounds);
        let (mut scans, mut engines) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
        for round in 0..rounds {
            let (s, e) = if round % 2 == 0 {
                let s = timed(&mut scan);
                (s, timed(&mut engine))
            } else {
                let e = timed(&mut engine);
                (timed(&mut scan), e)
            };
            ratios.push(e.as_secs_f64() / s.as_secs_f64());
            scans.push(s.as_secs_f64() * 1e6 / f64::from(BATCH));
            engines.push(e.as_secs_f64() * 1e6 / f64::from(BATCH));
        }
        for v in [&mut ratios, &mut scans, &mut engines] {
            v.sort_by(f64::total_cmp);
        }
        println!(
            "{mode} ({decided}), {} B | {:.2} µs | {:.2} µs | {:.3}× [{:.3}, {:.3}]",
            body.len(),
            quantile(&scans, 0.5),
            quantile(&engines, 0.5),
            quantile(&ratios, 0.5),
            quantile(&ratios, 0.25),
            quantile(&ratios, 0.75),
        );
    }
}
