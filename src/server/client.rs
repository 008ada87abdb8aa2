//! The API client: from `--kubeconfig` or the pod's service account for `serve`, and found as
//! kubectl finds its cluster for the client tools (`check-install`, `policies --apply`).

use std::{path::Path, process::ExitCode};

use kube::Client;

/// Why no API client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClusterAccessError {
    /// The kubeconfig file cannot be read or used.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// The pod's service account configuration.
    #[error("in-cluster configuration: {0}")]
    InCluster(String),
    /// The client itself.
    #[error("API client: {0}")]
    Client(String),
}

/// A client from `--kubeconfig`, else the in-cluster service account, else `None` (run
/// locally: no cluster checks).
pub async fn client(kubeconfig: Option<&Path>) -> Result<Option<Client>, ClusterAccessError> {
    let config = match kubeconfig {
        Some(path) => kubeconfig_file(path).await?,
        None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
            kube::Config::incluster().map_err(|e| ClusterAccessError::InCluster(e.to_string()))?
        }
        None => return Ok(None),
    };
    Client::try_from(config)
        .map(Some)
        .map_err(|e| ClusterAccessError::Client(e.to_string()))
}

async fn kubeconfig_file(path: &Path) -> Result<kube::Config, ClusterAccessError> {
    let err = |e: &dyn std::fmt::Display| ClusterAccessError::Kubeconfig {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let file = kube::config::Kubeconfig::read_from(path).map_err(|e| err(&e))?;
    kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .map_err(|e| err(&e))
}

/// Where [`cluster_source`] found the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterSource {
    /// `--kubeconfig`.
    Flag(String),
    /// `$KUBECONFIG` (one file or a list, merged as kubectl merges them).
    Env(String),
    /// `~/.kube/config`.
    Home(String),
    /// The pod's service account.
    InCluster,
}

impl std::fmt::Display for ClusterSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Flag(p) => write!(f, "--kubeconfig {p}"),
            Self::Env(p) => write!(f, "KUBECONFIG={p}"),
            Self::Home(p) => write!(f, "{p}"),
            Self::InCluster => f.write_str("the pod's service account"),
        }
    }
}

/// Where a client tool finds its cluster, in kubectl's order: `--kubeconfig`, else
/// `$KUBECONFIG`, else `~/.kube/config`, else the pod's service account; `None` when there is
/// none of them. (`serve` does not read `$KUBECONFIG` or `~/.kube/config`: run locally it makes
/// no cluster checks unless told to with `--kubeconfig`.)
pub fn cluster_source(kubeconfig: Option<&Path>) -> Option<ClusterSource> {
    let home = std::env::var_os("HOME").map(|h| Path::new(&h).join(".kube").join("config"));
    source_in_order(
        kubeconfig,
        std::env::var_os("KUBECONFIG"),
        home.filter(|p| p.is_file()),
        std::env::var_os("KUBERNETES_SERVICE_HOST").is_some(),
    )
}

fn source_in_order(
    flag: Option<&Path>,
    env: Option<std::ffi::OsString>,
    home: Option<std::path::PathBuf>,
    in_cluster: bool,
) -> Option<ClusterSource> {
    if let Some(path) = flag {
        Some(ClusterSource::Flag(path.display().to_string()))
    } else if let Some(env) = env.filter(|v| !v.is_empty()) {
        Some(ClusterSource::Env(env.to_string_lossy().into_owned()))
    } else if let Some(home) = home {
        Some(ClusterSource::Home(home.display().to_string()))
    } else {
        in_cluster.then_some(ClusterSource::InCluster)
    }
}

/// What a client tool (`check-install`, `policies --apply`) does first: a one-thread runtime,
/// the cluster kubectl would use (`kubeconfig` first), its client, and `<tool>: the cluster of
/// <source>` printed; then `work` with the client, whose exit code is the tool's. Exit 2 with
/// `<tool>: …` on stderr when there is no runtime, no cluster (`<tool>: <no_cluster>: no
/// --kubeconfig, …`) or no usable client.
pub fn with_cluster<F>(
    tool: &str,
    no_cluster: &str,
    kubeconfig: Option<&Path>,
    work: impl FnOnce(Client) -> F,
) -> ExitCode
where
    F: Future<Output = ExitCode>,
{
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{tool}: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async {
        let Some(source) = cluster_source(kubeconfig) else {
            eprintln!(
                "{tool}: {no_cluster}: no --kubeconfig, no KUBECONFIG, no ~/.kube/config, and not running in a pod"
            );
            return ExitCode::from(2);
        };
        let client = match client_for(&source).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{tool}: {e}");
                return ExitCode::from(2);
            }
        };
        println!("{tool}: the cluster of {source}");
        work(client).await
    })
}

/// A client for a [`ClusterSource`].
pub async fn client_for(source: &ClusterSource) -> Result<Client, ClusterAccessError> {
    let config = match source {
        ClusterSource::Flag(path) => kubeconfig_file(Path::new(path)).await?,
        ClusterSource::Env(paths) | ClusterSource::Home(paths) => {
            kube::Config::from_kubeconfig(&kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| ClusterAccessError::Kubeconfig {
                    path: paths.clone(),
                    message: e.to_string(),
                })?
        }
        ClusterSource::InCluster => {
            kube::Config::incluster().map_err(|e| ClusterAccessError::InCluster(e.to_string()))?
        }
    };
    Client::try_from(config).map_err(|e| ClusterAccessError::Client(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_tool_finds_its_cluster_in_kubectls_order() {
        use std::path::PathBuf;
        let flag = Path::new("/flag");
        let env = || Some("/a:/b".into());
        let home = || Some(PathBuf::from("/root/.kube/config"));
        let found = |f, e, h, c| source_in_order(f, e, h, c);
        assert_eq!(
            found(Some(flag), env(), home(), true),
            Some(ClusterSource::Flag("/flag".into()))
        );
        assert_eq!(
            found(None, env(), home(), true),
            Some(ClusterSource::Env("/a:/b".into()))
        );
        // An empty KUBECONFIG is unset, as for kubectl.
        assert_eq!(
            found(None, Some("".into()), home(), true),
            Some(ClusterSource::Home("/root/.kube/config".into()))
        );
        assert_eq!(
            found(None, None, None, true),
            Some(ClusterSource::InCluster)
        );
        assert_eq!(found(None, None, None, false), None);
    }
}
