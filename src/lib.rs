#![warn(missing_docs)]
//! ephemeral-volume-injector: a mutating admission webhook that injects scratch and secret
//! volumes into pods from string annotations.
//!
//! The decision logic is pure and lives apart from the transport: [`annotation`] is the grammar,
//! [`config`] the cluster configuration, [`engine`] the decision, [`patch`] the JSON Patch,
//! [`review`] the AdmissionReview codec; [`server`] is the HTTPS/admin plumbing.

pub mod annotation;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod config_file;
pub mod decision;
pub mod echo;
pub mod engine;
pub mod install_check;
pub mod patch;
pub mod pod;
pub mod policies;
pub mod quantity;
pub mod review;
pub mod selector;
pub mod server;
pub mod validate;
pub mod volume;
pub mod workload;
pub mod yaml_nesting;
