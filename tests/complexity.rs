#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a broken fixture should stop it loudly
//! What one review costs as its input grows on purpose, family by family: a tenant who may only
//! create pods grows one part of a pod (a JSON value, its annotations, its containers, their
//! mounts, a `containers=` list, its names, a Job's template) and doubles it, from ~32 KiB to
//! ~1 MiB of review. Each doubling may at most double the cost, with room for the fixed part
//! (the ratio of 2n to n is held to [`MAX_RATIO`]); and the largest costs at most
//! [`MAX_PER_KIB`] times what an ordinary Nextflow review costs per KiB.
//!
//! The cost counted here is the heap's — allocations and bytes allocated, the same in every run
//! whatever the machine's load. The instructions of the same families (what catches work that
//! allocates nothing, like a scan of names against names) are counted by callgrind:
//! `python3 benches/complexity.py` runs this binary one case at a time
//! (`EVI_COMPLEXITY_CASE=<family>:<step>`) and holds those counts to the same bounds.

use std::alloc::System;

use evi::{config::Config, review};
use serde_json::{Value, json};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[path = "common/mod.rs"]
mod common;

/// The most one doubling of an input may multiply a review's cost by.
const MAX_RATIO: f64 = 2.3;
/// The most a review of the largest input may cost per KiB, as a multiple of an ordinary
/// Nextflow review's cost per KiB.
const MAX_PER_KIB: f64 = 8.0;
/// Doublings per family: sizes `base · 2^0` … `base · 2^STEPS`.
const STEPS: u32 = 5;

/// A family: a name, the endpoint, and the review of size step `n` (0 ..= STEPS).
struct Family {
    name: &'static str,
    endpoint: review::Endpoint,
    review: fn(u32) -> Vec<u8>,
}

/// Grows with `2^step`: `base << step`.
fn grown(base: usize, step: u32) -> usize {
    base << step
}

fn pod(annotations: Value, containers: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "nf-", "namespace": "nf", "annotations": annotations},
        "spec": {"containers": containers}
    })
}

fn pod_review(pod: &Value) -> Vec<u8> {
    serde_json::to_vec(&common::review_for(pod, "nf", "0000-complexity")).unwrap()
}

fn container(name: &str) -> Value {
    json!({"name": name, "image": "busybox"})
}

/// Up to 64 volume annotations in the JSON form, ~15 KiB each at the largest step (within the
/// bound on one value), made of arrays nested `depth` deep under an unknown field.
fn json_values(n: u32, depth: usize) -> Vec<u8> {
    json_items(n, &format!("{}0{}", "[".repeat(depth), "]".repeat(depth)))
}

/// Up to 64 volume annotations in the JSON form, ~15 KiB each at the largest step, each a list
/// of `item` under an unknown field of its emptyDir.
fn json_items(n: u32, item: &str) -> Vec<u8> {
    let count = grown(1, n).min(64);
    let per = grown(15 * 1024, n) / count;
    let items: Vec<&str> = std::iter::repeat_n(item, per / (item.len() + 1)).collect();
    let value = format!(
        r#"{{"type":"emptyDir","mountPath":"/s","emptyDir":{{"x":[{}]}}}}"#,
        items.join(",")
    );
    let annotations: serde_json::Map<String, Value> = (0..count)
        .map(|i| {
            (
                format!("ephemeral-volumes.io/v{i}"),
                Value::String(value.clone()),
            )
        })
        .collect();
    pod_review(&pod(Value::Object(annotations), json!([container("main")])))
}

/// Up to 64 volume annotations, ~15 KiB of values in each at the largest step: annotation `i`
/// is `value(i, per)`, where `per` is the number of list items or pairs a value of that size has
/// room for at `item_bytes` bytes each.
fn volume_annotations(
    n: u32,
    item_bytes: usize,
    value: impl Fn(usize, usize) -> String,
) -> Vec<u8> {
    let count = grown(1, n).min(64);
    let per = grown(15 * 1024, n) / count / item_bytes;
    let annotations: serde_json::Map<String, Value> = (0..count)
        .map(|i| {
            (
                format!("ephemeral-volumes.io/v{i}"),
                Value::String(value(i, per)),
            )
        })
        .collect();
    pod_review(&pod(Value::Object(annotations), json!([container("m")])))
}

const SCRATCH: &str = "type=emptyDir,size=1Gi,mountPath=/scratch,env=TMPDIR";

fn families() -> Vec<Family> {
    use review::Endpoint::{Mutate, Validate};
    vec![
        // One volume annotation in the JSON form with one long key and a long array under it
        // (the duplicate-key check once copied the path for every element).
        Family {
            name: "json-long-key",
            endpoint: Mutate,
            review: |n| {
                let len = grown(2 * 1024, n);
                let key = "k".repeat(len / 2);
                let value = json!({"type": "emptyDir", "mountPath": "/s",
                                   "x": {key: vec![0; len / 4]}});
                pod_review(&pod(
                    json!({"ephemeral-volumes.io/s": value.to_string()}),
                    json!([container("main")]),
                ))
            },
        },
        // Many volume annotations in the JSON form, each nested 100 deep: refused at 16.
        Family {
            name: "json-deep-values",
            endpoint: Mutate,
            review: |n| json_values(n, 100),
        },
        // The same, nested as deep as a value may (16): arrays of one-element arrays.
        Family {
            name: "json-nested-values",
            endpoint: Mutate,
            review: |n| json_values(n, 13),
        },
        // The same, made of small objects: every object's keys checked for a repeat, every
        // key a field the source does not know.
        Family {
            name: "json-small-objects",
            endpoint: Mutate,
            review: |n| json_items(n, r#"{"a":0}"#),
        },
        // One source with thousands of fields it does not know (each is named, up to a bound).
        Family {
            name: "json-unknown-fields",
            endpoint: Mutate,
            review: |n| {
                let fields: serde_json::Map<String, Value> = (0..grown(100, n))
                    .map(|i| (format!("k{i}"), json!(0)))
                    .collect();
                let value = json!({"type": "emptyDir", "mountPath": "/s", "emptyDir": fields});
                pod_review(&pod(
                    json!({"ephemeral-volumes.io/s": value.to_string()}),
                    json!([container("main")]),
                ))
            },
        },
        // A list field of the JSON form as long as a value may be, of names and of numbers.
        Family {
            name: "json-long-lists",
            endpoint: Mutate,
            review: |n| {
                volume_annotations(n, 4, |i, per| {
                    let list = if i % 2 == 0 {
                        json!(vec!["m"; per])
                    } else {
                        json!(vec![0; per])
                    };
                    json!({"type": "emptyDir", "mountPath": "/s", "containers": list}).to_string()
                })
            },
        },
        // Thousands of key=value annotations that are not the webhook's, and one that is.
        Family {
            name: "many-annotations",
            endpoint: Mutate,
            review: |n| {
                let mut annotations: serde_json::Map<String, Value> = (0..grown(1000, n))
                    .map(|i| {
                        (
                            format!("example.com/a{i}"),
                            json!("type=emptyDir,size=1Gi,mountPath=/x"),
                        )
                    })
                    .collect();
                annotations.insert("ephemeral-volumes.io/scratch".into(), json!(SCRATCH));
                pod_review(&pod(Value::Object(annotations), json!([container("main")])))
            },
        },
        // Thousands of volume annotations: refused by count before any is read.
        Family {
            name: "many-volume-annotations",
            endpoint: Mutate,
            review: |n| {
                let annotations: serde_json::Map<String, Value> = (0..grown(800, n))
                    .map(|i| {
                        (
                            format!("ephemeral-volumes.io/v{i}"),
                            json!(format!("type=emptyDir,size=1Gi,mountPath=/v{i}")),
                        )
                    })
                    .collect();
                pod_review(&pod(Value::Object(annotations), json!([container("main")])))
            },
        },
        // Near misses of the prefix, each a hint.
        Family {
            name: "near-miss-annotations",
            endpoint: Mutate,
            review: |n| {
                let mut annotations: serde_json::Map<String, Value> = (0..grown(1000, n))
                    .map(|i| (format!("ephemeral-volume.io/v{i}"), json!(SCRATCH)))
                    .collect();
                annotations.insert("ephemeral-volumes.io/scratch".into(), json!(SCRATCH));
                pod_review(&pod(Value::Object(annotations), json!([container("main")])))
            },
        },
        // Keys of the prefix's length, each prefix another: each is measured against the
        // configured prefix.
        Family {
            name: "prefix-length-keys",
            endpoint: Mutate,
            review: |n| {
                let mut annotations: serde_json::Map<String, Value> = (0..grown(1000, n))
                    .map(|i| (format!("ephemeral-volum{i:05}/v"), json!("x")))
                    .collect();
                annotations.insert("ephemeral-volumes.io/scratch".into(), json!(SCRATCH));
                pod_review(&pod(Value::Object(annotations), json!([container("main")])))
            },
        },
        // The most volumes a pod may ask for, times a growing number of containers.
        Family {
            name: "volumes-x-containers",
            endpoint: Mutate,
            review: |n| {
                let annotations: serde_json::Map<String, Value> = (0..64)
                    .map(|i| {
                        (
                            format!("ephemeral-volumes.io/v{i}"),
                            json!(format!("type=emptyDir,size=1Gi,mountPath=/v{i},env=V{i}")),
                        )
                    })
                    .collect();
                let containers: Vec<Value> = (0..grown(400, n))
                    .map(|i| container(&format!("c{i}")))
                    .collect();
                pod_review(&pod(Value::Object(annotations), Value::Array(containers)))
            },
        },
        // One volume for every container of a growing pod (a patch that grows with it, up to
        // the bound on its operations).
        Family {
            name: "containers",
            endpoint: Mutate,
            review: |n| {
                let containers: Vec<Value> = (0..grown(400, n))
                    .map(|i| container(&format!("c{i}")))
                    .collect();
                pod_review(&pod(
                    json!({"ephemeral-volumes.io/scratch": SCRATCH}),
                    Value::Array(containers),
                ))
            },
        },
        // One container with a growing number of mounts and variables, 64 volumes added to it.
        Family {
            name: "mounts",
            endpoint: Mutate,
            review: |n| {
                let count = grown(400, n);
                let mounts: Vec<Value> = (0..count)
                    .map(|i| json!({"name": format!("m{i}"), "mountPath": format!("/m/{i}")}))
                    .collect();
                let env: Vec<Value> = (0..count)
                    .map(|i| json!({"name": format!("E{i}"), "value": "x"}))
                    .collect();
                let annotations: serde_json::Map<String, Value> = (0..64)
                    .map(|i| {
                        (
                            format!("ephemeral-volumes.io/v{i}"),
                            json!(format!("type=emptyDir,size=1Gi,mountPath=/v{i},env=V{i}")),
                        )
                    })
                    .collect();
                pod_review(&pod(
                    Value::Object(annotations),
                    json!([{"name": "main", "image": "busybox", "volumeMounts": mounts, "env": env}]),
                ))
            },
        },
        // A `containers=` list as long as a list may be (1,024 names), against a growing pod that
        // has every container it names.
        Family {
            name: "containers-list",
            endpoint: Mutate,
            review: |n| {
                let count = grown(1600, n);
                let listed: Vec<String> = (0..1024).map(|i| format!("c{i}")).collect();
                let value = format!(
                    "type=emptyDir,size=1Gi,mountPath=/s,containers={}",
                    listed.join(";")
                );
                let containers: Vec<Value> =
                    (0..count).map(|i| container(&format!("c{i}"))).collect();
                pod_review(&pod(
                    json!({"ephemeral-volumes.io/s": value}),
                    Value::Array(containers),
                ))
            },
        },
        // The most volume annotations a pod may have, each with a `containers=` list of
        // 1,024 names, against a growing pod that has every container they name: the pod's
        // containers are indexed once per review, not once per annotation (which made it
        // annotations × containers).
        Family {
            name: "annotations-x-containers",
            endpoint: Mutate,
            review: |n| {
                let listed: Vec<String> = (0..1024).map(|i| format!("c{i}")).collect();
                let listed = listed.join(";");
                let annotations: serde_json::Map<String, Value> = (0..64)
                    .map(|i| {
                        (
                            format!("ephemeral-volumes.io/v{i}"),
                            json!(format!(
                                "type=emptyDir,size=1Gi,mountPath=/v{i},containers={listed}"
                            )),
                        )
                    })
                    .collect();
                let containers: Vec<Value> = (0..grown(1600, n))
                    .map(|i| json!({"name": format!("c{i}")}))
                    .collect();
                pod_review(&pod(Value::Object(annotations), Value::Array(containers)))
            },
        },
        // `containers=` lists of short names in every volume annotation, each as long as a
        // value may be (a list is counted against its bound before it is read).
        Family {
            name: "short-names-lists",
            endpoint: Mutate,
            review: |n| {
                volume_annotations(n, 2, |i, per| {
                    format!(
                        "type=emptyDir,mountPath=/v{i},containers={}",
                        vec!["m"; per].join(";")
                    )
                })
            },
        },
        // Values of many pairs the grammar does not know, separated by commas or by `;` (which
        // asks for the separator hint, itself checked by the parser), in every volume annotation.
        Family {
            name: "unknown-pairs",
            endpoint: Mutate,
            review: |n| {
                volume_annotations(n, 8, |i, per| {
                    let sep = if i % 2 == 0 { "," } else { ";" };
                    let pairs: Vec<String> = (0..per).map(|j| format!("k{}=1", j % 1000)).collect();
                    format!("type=emptyDir,mountPath=/v{i},{}", pairs.join(sep))
                })
            },
        },
        // Huge names: the pod's generateName and its container's name.
        Family {
            name: "huge-names",
            endpoint: Mutate,
            review: |n| {
                let len = grown(16 * 1024, n);
                let mut pod = pod(
                    json!({"ephemeral-volumes.io/scratch": SCRATCH}),
                    json!([container(&"c".repeat(len))]),
                );
                pod["metadata"]["generateName"] = json!("g".repeat(len));
                pod_review(&pod)
            },
        },
        // A Job UPDATE whose template grows (and changes), at /validate.
        Family {
            name: "job-update",
            endpoint: Validate,
            review: |n| {
                let env: Vec<Value> = (0..grown(300, n))
                    .map(|i| json!({"name": format!("E{i}"), "value": "v".repeat(20)}))
                    .collect();
                let pod = pod(
                    json!({"ephemeral-volumes.io/scratch": SCRATCH}),
                    json!([{"name": "main", "image": "busybox", "env": env}]),
                );
                let new = common::workload_of("Job", &pod);
                let mut old = new.clone();
                old["spec"]["template"]["spec"]["containers"][0]["image"] = json!("busybox:old");
                serde_json::to_vec(&common::workload_review(&new, Some(&old), "nf")).unwrap()
            },
        },
    ]
}

/// The configuration the families run under: inline volumes allowed, no `maxVolumesPerPod`,
/// so that the built-in bounds are the ones that hold.
fn config() -> Config {
    Config::parse("policy: {allowInline: true, types: [emptyDir, csi, ephemeral]}").unwrap()
}

/// Allocations and bytes allocated by one review (after one run that is not counted).
fn heap(cfg: &Config, endpoint: review::Endpoint, body: &[u8]) -> (usize, usize) {
    review::handle(cfg, None, endpoint, body).unwrap();
    let region = Region::new(GLOBAL);
    let handled = review::handle(cfg, None, endpoint, body).unwrap();
    drop(handled);
    let change = region.change();
    (
        change.allocations + change.reallocations,
        change.bytes_allocated,
    )
}

/// The ordinary review every family is held to, per KiB.
fn nextflow_review() -> Vec<u8> {
    common::pod_review_bytes("nextflow-job-mode")
}

#[test]
fn every_family_costs_at_most_linearly_more_as_its_input_doubles() {
    let cfg = config();
    // One case, for callgrind (benches/complexity.py): reviewed once, nothing asserted.
    if let Ok(case) = std::env::var("EVI_COMPLEXITY_CASE") {
        let (endpoint, body) = match case.split_once(':') {
            Some(("nextflow", _)) => (review::Endpoint::Mutate, nextflow_review()),
            Some((name, step)) => {
                let f = families()
                    .into_iter()
                    .find(|f| f.name == name)
                    .expect("a family");
                (f.endpoint, (f.review)(step.parse().expect("a step")))
            }
            None => panic!("EVI_COMPLEXITY_CASE is <family>:<step>"),
        };
        let handled = review::handle(&cfg, None, endpoint, &body).unwrap();
        println!("{} bytes in, {} out", body.len(), handled.body.len());
        return;
    }
    let ordinary = nextflow_review();
    let (_, ordinary_bytes) = heap(&common::test_config(), review::Endpoint::Mutate, &ordinary);
    let ordinary_per_kib = ordinary_bytes as f64 / (ordinary.len() as f64 / 1024.0);
    let mut failures = Vec::new();
    for f in families() {
        let mut last: Option<(usize, usize, usize)> = None;
        for step in 0..=STEPS {
            let body = (f.review)(step);
            let (allocations, bytes) = heap(&cfg, f.endpoint, &body);
            println!(
                "{:24} {:>9} B in: {:>7} allocations, {:>10} B allocated",
                f.name,
                body.len(),
                allocations,
                bytes
            );
            if let Some((size, a, b)) = last {
                let grew = body.len() as f64 / size as f64;
                // Held to the input's own growth (each doubles it, or nearly).
                let limit = MAX_RATIO * grew / 2.0;
                for (what, before, now) in [("allocations", a, allocations), ("bytes", b, bytes)] {
                    let ratio = now as f64 / before.max(1) as f64;
                    if ratio > limit.max(MAX_RATIO) && now > 64 * 1024 {
                        failures.push(format!(
                            "{}: {what} grew {ratio:.2}× from {size} to {} bytes in",
                            f.name,
                            body.len()
                        ));
                    }
                }
            }
            if step == STEPS {
                let per_kib = bytes as f64 / (body.len() as f64 / 1024.0);
                if per_kib > MAX_PER_KIB * ordinary_per_kib {
                    failures.push(format!(
                        "{}: {per_kib:.0} B allocated per KiB in, more than {}× a Nextflow review's {ordinary_per_kib:.0}",
                        f.name, MAX_PER_KIB
                    ));
                }
            }
            last = Some((body.len(), allocations, bytes));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
