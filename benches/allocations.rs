#![allow(clippy::unwrap_used)] // a benchmark: a broken fixture should stop it loudly
//! Heap allocations per review: the engine's decode → decide → encode on the engine bench's
//! reviews, counted by an instrumented allocator. Unlike a time, the count does not move with
//! the machine's load, so a change to the engine shows its effect here even on a noisy day.
//! `cargo bench --bench allocations` prints a line per review; benches/README.md reports them.

use std::alloc::System;

use evi::review;
use serde::de::IgnoredAny;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

// Counted over the system allocator: the number of allocations is the code's, whatever
// allocator serves them (the binary's is mimalloc).
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[path = "../tests/common/mod.rs"]
mod common;

/// Allocations and bytes allocated by one call of `f` (the same every call: it is run once
/// first, so that lazily built state is not counted).
fn count(mut f: impl FnMut()) -> (usize, usize) {
    f();
    let region = Region::new(GLOBAL);
    f();
    let change = region.change();
    (
        change.allocations + change.reallocations,
        change.bytes_allocated,
    )
}

fn main() {
    // `cargo bench` passes `--bench`; a filter or other flags mean nothing here.
    let cfg = common::test_config();
    let job = {
        let pod = common::read_input("nextflow-job-mode");
        let job = common::workload_of("Job", &pod);
        serde_json::to_vec(&common::workload_review(&job, None, "nf")).unwrap()
    };
    let cases = [
        (
            "job-mode pod at /mutate",
            review::Endpoint::Mutate,
            common::pod_review_bytes("nextflow-job-mode"),
        ),
        (
            "pod-mode pod at /mutate",
            review::Endpoint::Mutate,
            common::pod_review_bytes("nextflow-pod-mode"),
        ),
        ("job-mode Job at /validate", review::Endpoint::Validate, job),
    ];
    println!(
        "review | bytes in | IgnoredAny scan: allocations | engine: allocations, bytes allocated"
    );
    for (name, endpoint, body) in cases {
        let (scan, _) = count(|| {
            serde_json::from_slice::<IgnoredAny>(&body).unwrap();
        });
        let (allocations, bytes) = count(|| {
            let handled = review::handle(&cfg, None, endpoint, &body).unwrap();
            assert!(handled.decision.allowed() || endpoint == review::Endpoint::Validate);
        });
        println!("{name} | {} | {scan} | {allocations}, {bytes}", body.len());
    }
    // The decision log line, formatted into `io::sink` (benches/log_line.rs times it).
    println!("decision log line | allocations, bytes allocated");
    for (name, dispatch) in common::log_formats() {
        let (allocations, bytes) =
            tracing::dispatcher::with_default(&dispatch, || count(common::decision_line));
        println!("{name} | {allocations}, {bytes}");
    }
}
