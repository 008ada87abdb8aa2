//! Command-line interface: `serve`, `mutate` (the preview: `preview.rs`), `check-config`,
//! `check-install`, `policies` (`policies.rs`).

mod policies;
pub mod preview;

use std::{
    io::{Read, Write},
    path::PathBuf,
    process::ExitCode,
};

use clap::{Parser, Subcommand, ValueEnum};

use crate::{
    cluster::ClusterState,
    config::{Config, ConfigError},
    decision::Decision,
    patch::Patch,
    server::ServeArgs,
    workload,
};

/// The version `--version` prints: the crate's (the chart's appVersion) and the commit built.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("EVI_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "ephemeral-volume-injector",
    version = VERSION,
    about = "Injects emptyDir, CSI inline and generic ephemeral volumes into pods from annotations"
)]
/// The command line.
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the webhook (HTTPS) and the admin endpoints (HTTP).
    Serve(Box<ServeArgs>),
    /// Preview what the webhook would do to a Pod or a workload's pod template.
    Mutate(MutateArgs),
    /// Validate a configuration; lists every error. FILE is the configuration, the chart's
    /// values file (its `config:` value) or the chart's ConfigMap (alone or among the other
    /// manifests `helm template` prints); it says which it read.
    CheckConfig {
        /// The configuration, a Helm values file or a ConfigMap manifest (YAML).
        file: PathBuf,
    },
    /// Check that the webhook is wired into the API server: a dry-run pod gets its volume and
    /// a dry-run Job asking for an impossible one is refused (the chart's install hook and
    /// `helm test`); a failure names its cause.
    CheckInstall(crate::install_check::CheckInstallArgs),
    /// Compile the configuration into admission policies the API server runs itself
    /// (a MutatingAdmissionPolicy for pods, ValidatingAdmissionPolicies for pods and for the
    /// pod controllers whose template asks, with their bindings; Kubernetes 1.36+), printed as
    /// YAML for `kubectl apply -f -`. What they cannot do that the webhook
    /// does is said on stderr and in a comment; a configuration they would serve otherwise is
    /// refused (exit 2), naming the key. docs/policies.md: when to pick which.
    Policies(PoliciesArgs),
    /// Print the pod controllers the workload webhook checks, as JSON (group, version, kind,
    /// resource, where the pod template is): what the chart's tests check its webhook rules
    /// and CEL paths against.
    #[command(hide = true)]
    PrintWorkloads,
}

/// `policies`' arguments.
#[derive(Debug, clap::Args)]
pub struct PoliciesArgs {
    /// The configuration, a Helm values file or a ConfigMap manifest (as `check-config`
    /// reads); built-in defaults without it.
    #[arg(long, env = "EVI_CONFIG")]
    pub config: Option<PathBuf>,
    /// The name of the policies and their bindings (the pod controllers' policies add
    /// `-workloads` and `-cronjobs` to it).
    #[arg(long, default_value = "ephemeral-volume-injector")]
    pub name: String,
    /// A namespace the policies leave alone (repeatable), as the chart's
    /// `webhook.excludeNamespaces`.
    #[arg(long = "exclude-namespace", value_name = "NAMESPACE", default_values_t = [String::from("kube-system")])]
    pub exclude: Vec<String>,
    /// Only warn and record where the policies would refuse, and add nothing (no mutating
    /// policy; `validationActions: [Warn, Audit]`): to run beside the webhook and compare
    /// before switching.
    #[arg(long)]
    pub audit: bool,
    /// Apply the objects to the cluster (server-side apply, field manager
    /// `ephemeral-volume-injector`) instead of printing them, and delete those of the same name
    /// this configuration no longer writes (the mutating policy after `--audit`). The cluster is
    /// found as kubectl finds it: `--kubeconfig`, `$KUBECONFIG`, `~/.kube/config`, in-cluster.
    #[arg(long, conflicts_with = "delete")]
    pub apply: bool,
    /// Delete every object `policies` writes under `--name` from the cluster (what `helm
    /// uninstall` runs); the configuration is not read.
    #[arg(long)]
    pub delete: bool,
    /// The kubeconfig for `--apply` and `--delete`.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// `mutate`'s arguments.
#[derive(Debug, clap::Args)]
pub struct MutateArgs {
    /// Pod, Job, CronJob, Deployment, StatefulSet, DaemonSet, ReplicaSet or
    /// ReplicationController, as YAML or JSON; `-`
    /// for stdin. A multi-document stream or a List (what `helm template` or `kustomize build`
    /// prints): every object in order, other kinds passed through unchanged with a note on
    /// stderr (the output is then a `---` stream, a List, or with `-o patch` an array of one
    /// patch per object).
    #[arg(value_name = "FILE", required_unless_present = "filename")]
    pub file: Option<String>,
    /// The same as FILE (as kubectl spells it).
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "FILE",
        conflicts_with = "file"
    )]
    pub filename: Option<String>,
    /// Exit 1 when there is any warning (a near-miss annotation key, the annotation prefix on
    /// a workload's own metadata or as a label, a variable left alone, …), as well as on a
    /// refusal.
    #[arg(long)]
    pub strict: bool,
    /// Configuration file (the same one `serve --config` reads); built-in defaults without it.
    #[arg(long, env = "EVI_CONFIG")]
    pub config: Option<PathBuf>,
    /// CSIDriver and StorageClass objects for the cluster checks, as `kubectl get
    /// csidrivers,storageclasses -o yaml` prints them (a List or a multi-document stream).
    /// Without it the checks are off.
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// Namespace to match rules against (default: the object's, else `default`).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Output: the mutated object as YAML or JSON, or the RFC 6902 patch.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Yaml)]
    pub output: Output,
}

/// What `mutate` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// The mutated object(s) as YAML.
    Yaml,
    /// The mutated object(s) as JSON.
    Json,
    /// The JSON Patch (one array per document).
    Patch,
}

/// Runs a command; the exit code says how it went (2: usage or input error, 1: denied).
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve(args) => crate::server::run(*args),
        Command::Mutate(args) => mutate(&args),
        Command::CheckConfig { file } => check_config(&file),
        Command::CheckInstall(args) => crate::install_check::run(&args),
        Command::Policies(args) => policies::run(&args),
        Command::PrintWorkloads => {
            println!("{:#}", crate::workload::table_json());
            ExitCode::SUCCESS
        }
    }
}

fn check_config(file: &std::path::Path) -> ExitCode {
    let parsed = std::fs::read_to_string(file)
        .map_err(|e| ConfigError::Read {
            path: file.display().to_string(),
            message: e.to_string(),
        })
        .and_then(|text| crate::config_file::configuration_in(&text))
        .map(|(text, found)| (Config::parse(&text), found));
    match parsed {
        Ok((Ok(cfg), found)) => {
            let count = |n: usize, one: &str| format!("{n} {one}{}", if n == 1 { "" } else { "s" });
            println!(
                "{}: {found}: valid ({}, {}, annotation prefix {})",
                file.display(),
                count(cfg.profiles.len(), "profile"),
                count(cfg.rules.len(), "rule"),
                cfg.prefix
            );
            ExitCode::SUCCESS
        }
        Ok((Err(ConfigError::Invalid(errors)), found)) => {
            eprintln!("{}: {found}: invalid configuration", file.display());
            for e in errors {
                eprintln!("  - {e}");
            }
            ExitCode::from(1)
        }
        Err(ConfigError::Invalid(errors)) => {
            eprintln!("{}: invalid", file.display());
            for e in errors {
                eprintln!("  - {e}");
            }
            ExitCode::from(1)
        }
        Ok((Err(e @ ConfigError::Read { .. }), _)) | Err(e @ ConfigError::Read { .. }) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn mutate(args: &MutateArgs) -> ExitCode {
    let (previews, warned) = match read_inputs(args).and_then(|inputs| preview_all(args, &inputs)) {
        Ok(Some(previews)) => previews,
        Ok(None) => return ExitCode::from(1),
        Err(msg) => {
            eprintln!("error: {msg}");
            return ExitCode::from(2);
        }
    };
    match render(args.output, &previews) {
        Ok(mut s) => {
            if !s.ends_with('\n') {
                s.push('\n');
            }
            if std::io::stdout().write_all(s.as_bytes()).is_err() {
                return ExitCode::from(2);
            }
            if args.strict && warned {
                eprintln!("error: warnings, and --strict");
                return ExitCode::from(1);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: cannot print the result: {e}");
            ExitCode::from(2)
        }
    }
}

impl MutateArgs {
    /// FILE or `-f FILE` (clap requires one).
    fn input(&self) -> &str {
        self.file
            .as_deref()
            .or(self.filename.as_deref())
            .unwrap_or("-")
    }
}

struct Inputs {
    cfg: Config,
    cluster: Option<ClusterState>,
    objects: Vec<serde_json::Value>,
}

/// Reads the configuration, the cluster objects and the documents; the error names the file.
fn read_inputs(args: &MutateArgs) -> Result<Inputs, String> {
    let cfg = match &args.config {
        Some(path) => crate::config_file::load(path)
            .map(|(cfg, _)| cfg)
            .map_err(|e| format!("configuration {}: {e}", path.display()))?,
        None => Config::default(),
    };
    let cluster = match &args.cluster {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| e.to_string())
                .and_then(|t| ClusterState::parse(&t).map_err(|e| e.to_string()))
                .map_err(|e| format!("cluster objects {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let mut text = String::new();
    let file = args.input();
    let read = if file == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(file).map(|t| text = t)
    };
    read.map_err(|e| format!("cannot read {file}: {e}"))?;
    let objects = preview::parse_objects(&text).map_err(|e| format!("{file}: {e}"))?;
    Ok(Inputs {
        cfg,
        cluster,
        objects,
    })
}

/// Every document's preview, its warnings and denials on standard error; `None` when one was
/// denied (nothing is printed then).
/// Every object's preview, and whether anything was warned about; `None` when one is refused.
fn preview_all(
    args: &MutateArgs,
    inputs: &Inputs,
) -> Result<Option<(Vec<preview::Preview>, bool)>, String> {
    let many = inputs.objects.len() > 1;
    if let Some(note) = inputs.cfg.needs_namespace_labels()
        && inputs
            .cluster
            .as_ref()
            .is_none_or(|c| c.namespaces.is_empty())
    {
        eprintln!("note: {note} (give the Namespace objects with --cluster)");
    }
    let mut previews = Vec::with_capacity(inputs.objects.len());
    let mut denied = false;
    let mut warned = false;
    for (i, object) in inputs.objects.iter().enumerate() {
        // With several documents, every message says which one it is about.
        let which = if many {
            format!("document {} ({}): ", i + 1, describe(object))
        } else {
            String::new()
        };
        let kind = object["kind"].as_str().unwrap_or_default();
        let Some(pointer) = preview::template_path_of(object) else {
            // A Service, a ConfigMap, …: as it came, in its place.
            eprintln!("note: {which}{kind} has no pod template; passed through unchanged");
            previews.push(preview::Preview {
                decision: Decision::Unchanged {
                    warnings: Vec::new(),
                },
                mutated: object.clone(),
            });
            continue;
        };
        if workload::template_path(kind).is_none() {
            // A custom workload: what its pods would get, and how to have it checked.
            eprintln!(
                "note: {which}{kind} is a custom workload: its pod template at spec.template is \
                 previewed as a Deployment's would be (its pods get the same at creation); the \
                 chart sends it to /validate, to be refused at creation as a Deployment is, once \
                 its resource is listed in webhook.workloads.customResources"
            );
        }
        let known = inputs
            .cluster
            .as_ref()
            .map(|state| crate::cluster::KnownCluster {
                state,
                complete: true,
            });
        let preview = preview::preview(&inputs.cfg, known, object, args.namespace.as_deref())
            .map_err(|e| format!("{}: {which}{e}", args.input()))?;
        let own = workload_own_annotations(&inputs.cfg, object, kind, pointer);
        for w in own.iter().chain(preview.decision.warnings()) {
            eprintln!("warning: {which}{w}");
            warned = true;
        }
        if let Decision::Denied(d) = &preview.decision {
            eprintln!("denied ({}): {which}{}", d.code(), d.message);
            denied = true;
        }
        previews.push(preview);
    }
    Ok((!denied).then_some((previews, warned)))
}

/// Annotations of the prefix on a workload's own metadata, where the webhook never reads them
/// (it reads the pod template's; the chart does not even send such a workload to it).
fn workload_own_annotations(
    cfg: &Config,
    object: &serde_json::Value,
    kind: &str,
    pointer: &str,
) -> Vec<String> {
    if pointer.is_empty() {
        return Vec::new();
    }
    let template = pointer.trim_start_matches('/').replace('/', ".");
    object["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.split_once('/').is_some_and(|(p, _)| p == cfg.prefix))
        .map(|(k, _)| {
            format!(
                "annotation {k} is on the {kind} itself, which the webhook does not read: \
                 put it on the pod template ({template}.metadata.annotations)"
            )
        })
        .collect()
}

/// One document as it came (YAML, JSON), several as kubectl prints them: a `---` stream, a
/// `List`, and for patches a JSON array with one patch per document, in order.
fn render(output: Output, previews: &[preview::Preview]) -> Result<String, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    // No patch prints as an empty one.
    let none = Patch::default();
    let patch = |p: &'_ preview::Preview| -> Patch { p.decision.patch().unwrap_or(&none).clone() };
    match (output, previews) {
        (Output::Yaml, [one]) => yaml_serde::to_string(&one.mutated).map_err(|e| err(&e)),
        (Output::Json, [one]) => serde_json::to_string_pretty(&one.mutated).map_err(|e| err(&e)),
        (Output::Patch, [one]) => serde_json::to_string_pretty(&patch(one)).map_err(|e| err(&e)),
        (Output::Yaml, many) => {
            let mut out = String::new();
            for p in many {
                out.push_str("---\n");
                out.push_str(&yaml_serde::to_string(&p.mutated).map_err(|e| err(&e))?);
            }
            Ok(out)
        }
        (Output::Json, many) => serde_json::to_string_pretty(&serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": many.iter().map(|p| &p.mutated).collect::<Vec<_>>(),
        }))
        .map_err(|e| err(&e)),
        (Output::Patch, many) => {
            let patches = many.iter().map(patch).collect::<Vec<_>>();
            serde_json::to_string_pretty(&patches).map_err(|e| err(&e))
        }
    }
}

/// `Kind/name` of an object, for messages about one document of several.
fn describe(object: &serde_json::Value) -> String {
    let kind = object["kind"].as_str().unwrap_or("object");
    let meta = &object["metadata"];
    match meta["name"].as_str().or(meta["generateName"].as_str()) {
        Some(name) => format!("{kind}/{name}"),
        None => kind.to_owned(),
    }
}
