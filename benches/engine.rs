#![allow(clippy::unwrap_used)] // a benchmark: a broken fixture should stop it loudly
//! The engine on a realistic review body: decode → decide → encode, against a plain
//! `serde_json::from_slice::<IgnoredAny>` scan of the same bytes, measured in the same run.
//! `cargo bench --bench engine` prints both; the README reports the ratio.

use std::hint::black_box;

// The binary runs with mimalloc (src/main.rs); measure what it runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, criterion_group, criterion_main};
use evi::review;
use serde::de::IgnoredAny;
use serde_json::Value;

#[path = "../tests/common/mod.rs"]
mod common;

fn bench(c: &mut Criterion) {
    let cfg = common::test_config();
    // Job mode (Nextflow's default since 26.10: profiles by name) and Pod mode (inline
    // key=value annotations, the heavier decision); the README reports both ratios.
    for (mode, input) in [
        ("job-mode", "nextflow-job-mode"),
        ("pod-mode", "nextflow-pod-mode"),
    ] {
        let body = common::pod_review_bytes(input);
        assert!(
            matches!(
                review::handle(&cfg, None, review::Endpoint::Mutate, &body)
                    .unwrap()
                    .decision,
                evi::decision::Decision::Mutated { .. }
            ),
            "the {mode} fixture must be mutated"
        );
        let mut g = c.benchmark_group(format!("{mode}-{}B", body.len()));
        g.bench_function("baseline: from_slice::<IgnoredAny>", |b| {
            b.iter(|| serde_json::from_slice::<IgnoredAny>(black_box(&body)).unwrap())
        });
        g.bench_function("engine: decode+decide+encode", |b| {
            b.iter(|| {
                review::handle(
                    black_box(&cfg),
                    None,
                    review::Endpoint::Mutate,
                    black_box(&body),
                )
                .unwrap()
            })
        });
        g.finish();
    }
    // The workload webhook: the Job-mode pod as the template of a Nextflow Job, at
    // POST /validate, against the same pod at POST /mutate, in the same group.
    let pod = common::read_input("nextflow-job-mode");
    let job = common::workload_of("Job", &pod);
    let job_body = serde_json::to_vec(&common::workload_review(&job, None, "nf")).unwrap();
    let pod_body = common::pod_review_bytes("nextflow-job-mode");
    assert!(
        review::handle(&cfg, None, review::Endpoint::Validate, &job_body)
            .unwrap()
            .decision
            .allowed()
    );
    let mut g = c.benchmark_group("job-template");
    g.bench_function("pod at /mutate", |b| {
        b.iter(|| {
            review::handle(
                black_box(&cfg),
                None,
                review::Endpoint::Mutate,
                black_box(&pod_body),
            )
            .unwrap()
        })
    });
    g.bench_function("job template at /validate", |b| {
        b.iter(|| {
            review::handle(
                black_box(&cfg),
                None,
                review::Endpoint::Validate,
                black_box(&job_body),
            )
            .unwrap()
        })
    });
    g.finish();

    let body = common::pod_review_bytes("nextflow-pod-mode");
    let mut g = c.benchmark_group("pod-mode-breakdown");
    // The pod alone, read as the engine reads it (the body's UTF-8 checked once, parsed as str).
    let pod_text = serde_json::to_string(
        &serde_json::from_slice::<Value>(&body).unwrap()["request"]["object"],
    )
    .unwrap();
    g.bench_function("breakdown: pod view decode", |b| {
        b.iter(|| {
            serde_json::from_str::<evi::pod::PodView>(black_box(&pod_text))
                .unwrap()
                .spec
                .is_some()
        })
    });
    g.bench_function("breakdown: pod IgnoredAny scan", |b| {
        b.iter(|| serde_json::from_slice::<IgnoredAny>(black_box(pod_text.as_bytes())).unwrap())
    });
    let pod: evi::pod::PodView = serde_json::from_str(&pod_text).unwrap();
    g.bench_function("breakdown: decide only (plan + patch)", |b| {
        b.iter(|| {
            evi::engine::decide(
                &cfg,
                None,
                black_box(&pod),
                evi::engine::PodLocation {
                    namespace: "nf",
                    pointer: "",
                },
            )
            .patch()
            .map(|p| p.len())
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
