#![allow(clippy::unwrap_used)] // a benchmark
//! The decision log line (`--log-format json`): the webhook's own JSON format
//! (src/server/json_log.rs) against `tracing-subscriber`'s JSON format with the options the
//! webhook used before (flattened fields, no spans), both writing the "mutated" line of a
//! review into `io::sink`, in the same run. `cargo bench --bench log_line`; benches/README.md
//! reports both.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, criterion_group, criterion_main};

#[path = "../tests/common/mod.rs"]
mod common;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("decision-log-line");
    for (name, dispatch) in common::log_formats() {
        tracing::dispatcher::with_default(&dispatch, || {
            g.bench_function(name, |b| b.iter(common::decision_line));
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
