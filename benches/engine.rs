#![allow(clippy::unwrap_used)] // a benchmark: a broken fixture should stop it loudly
//! The engine on a realistic review body: decode → decide → encode, against a plain
//! `serde_json::from_slice::<IgnoredAny>` scan of the same bytes, measured in the same run.
//! `cargo bench --bench engine` prints both; the README reports the ratio.

use std::hint::black_box;

// The binary runs with mimalloc (src/main.rs); measure what it runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, criterion_group, criterion_main};
use evi::{config::Config, review};
use serde::de::IgnoredAny;
use serde_json::{Value, json};

fn body() -> Vec<u8> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");
    let pod: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{dir}/inputs/nextflow-pod-mode.json")).unwrap(),
    )
    .unwrap();
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "nf",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:nf:nextflow", "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    }))
    .unwrap()
}

fn bench(c: &mut Criterion) {
    let body = body();
    let cfg = Config::load(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/config.yaml"
    )))
    .unwrap();
    let mut g = c.benchmark_group(format!("review-{}B", body.len()));
    g.bench_function("baseline: from_slice::<IgnoredAny>", |b| {
        b.iter(|| serde_json::from_slice::<IgnoredAny>(black_box(&body)).unwrap())
    });
    g.bench_function("engine: decode+decide+encode", |b| {
        b.iter(|| review::handle(black_box(&cfg), black_box(&body)).unwrap())
    });
    let pod_bytes =
        serde_json::to_vec(&serde_json::from_slice::<Value>(&body).unwrap()["request"]["object"])
            .unwrap();
    g.bench_function("breakdown: pod view decode", |b| {
        b.iter(|| {
            serde_json::from_slice::<evi::pod::PodView>(black_box(&pod_bytes))
                .unwrap()
                .spec
                .is_some()
        })
    });
    g.bench_function("breakdown: pod IgnoredAny scan", |b| {
        b.iter(|| serde_json::from_slice::<IgnoredAny>(black_box(&pod_bytes)).unwrap())
    });
    let pod: evi::pod::PodView = serde_json::from_slice(&pod_bytes).unwrap();
    g.bench_function("breakdown: decide only", |b| {
        b.iter(|| {
            evi::engine::mutate(
                &cfg,
                black_box(&pod),
                evi::engine::Target {
                    namespace: "nf",
                    base: "",
                },
            )
            .patch
            .len()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
