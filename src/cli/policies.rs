//! `policies`: the configuration compiled into admission policies, printed as YAML, applied to
//! the cluster (`--apply`, what the chart's hook Job runs), or deleted (`--delete`).

use std::process::ExitCode;

use kube::{
    Client,
    api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams},
};
use serde_json::Value;

use super::PoliciesArgs;
use crate::{config::Config, policies::Policies};

/// The field manager of `--apply`.
const MANAGER: &str = "ephemeral-volume-injector";

pub fn run(args: &PoliciesArgs) -> ExitCode {
    if args.delete {
        return in_cluster(args, |client| delete(client, &args.name, &[]));
    }
    let cfg = match &args.config {
        Some(path) => match crate::config_file::load(path) {
            Ok((cfg, _)) => cfg,
            Err(e) => {
                eprintln!("error: configuration {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
        None => Config::default(),
    };
    let compiled = match crate::policies::compile(&cfg, &args.name, &args.exclude) {
        Ok(c) if args.audit => c.audit(),
        Ok(c) => c,
        Err(refused) => {
            eprintln!("error: the admission policies cannot serve this configuration:");
            for r in refused {
                eprintln!("  - {r}");
            }
            return ExitCode::from(2);
        }
    };
    for note in &compiled.notes {
        eprintln!("note: {note}");
    }
    if args.apply {
        return in_cluster(args, |client| apply(client, &args.name, &compiled));
    }
    print(&compiled)
}

fn print(compiled: &Policies) -> ExitCode {
    let mut out = String::from(
        "# Admission policies compiled by ephemeral-volume-injector (Kubernetes 1.36+).\n\
         # What they do not do that the webhook does:\n",
    );
    for note in &compiled.notes {
        out.push_str(&format!("#   - {note}\n"));
    }
    for doc in &compiled.documents {
        match yaml_serde::to_string(doc) {
            Ok(text) => out.push_str(&format!("---\n{text}")),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    }
    print!("{out}");
    ExitCode::SUCCESS
}

/// Runs `work` against the cluster kubectl would use; exit 1 if it fails, 2 without a cluster.
fn in_cluster<F>(args: &PoliciesArgs, work: impl FnOnce(Client) -> F) -> ExitCode
where
    F: Future<Output = Result<(), String>>,
{
    crate::server::with_cluster(
        "policies",
        "no cluster",
        args.kubeconfig.as_deref(),
        |client| async move {
            match work(client).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("policies: FAILED: {e}");
                    ExitCode::from(1)
                }
            }
        },
    )
}

/// The API of one kind of admission policy object (all cluster-scoped).
fn api(client: &Client, kind: &str) -> Api<DynamicObject> {
    let plural = match kind {
        "MutatingAdmissionPolicy" => "mutatingadmissionpolicies",
        "ValidatingAdmissionPolicy" => "validatingadmissionpolicies",
        "MutatingAdmissionPolicyBinding" => "mutatingadmissionpolicybindings",
        _ => "validatingadmissionpolicybindings",
    };
    let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

/// Each object applied in order (the policies before their bindings), then those of the same
/// name the configuration no longer writes deleted.
async fn apply(client: Client, name: &str, compiled: &Policies) -> Result<(), String> {
    let params = PatchParams::apply(MANAGER).force();
    let mut written = Vec::new();
    for doc in &compiled.documents {
        let (kind, object) = (text(doc, "kind"), text(&doc["metadata"], "name"));
        api(&client, kind)
            .patch(object, &params, &Patch::Apply(doc))
            .await
            .map_err(|e| format!("{kind}/{object}: {e}"))?;
        println!("policies: applied {kind}/{object}");
        written.push((kind, object));
    }
    delete(client, name, &written).await
}

/// Deletes every object of `name` but those `kept`, bindings before their policies (a
/// binding without its policy is an error the API server reports on every request).
async fn delete(client: Client, name: &str, kept: &[(&str, &str)]) -> Result<(), String> {
    let mut kinds = Policies::names(name);
    kinds.reverse();
    for (kind, objects) in kinds {
        for object in objects
            .iter()
            .filter(|o| !kept.contains(&(kind, o.as_str())))
        {
            match api(&client, kind)
                .delete(object, &DeleteParams::default())
                .await
            {
                Ok(_) => println!("policies: deleted {kind}/{object}"),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(format!("{kind}/{object}: {e}")),
            }
        }
    }
    Ok(())
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}
