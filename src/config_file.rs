//! What a platform engineer has in hand as a configuration: the file itself, the chart's
//! values file (its `config:` value), or the chart's ConfigMap as `helm template` or
//! `kubectl get -o yaml` prints it (its `data."config.yaml"`, alone or among other
//! manifests). `check-config` and `mutate --config` read all three and say which they read.

use std::path::Path;

use yaml_serde::Value;

use crate::config::{Config, ConfigError};

/// The ConfigMap key the chart writes the configuration under.
pub const CONFIGMAP_KEY: &str = "config.yaml";

/// Where in the file the configuration was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The file is a configuration.
    Configuration,
    /// The `config:` value of a Helm values file.
    HelmValues,
    /// `data."config.yaml"` of a ConfigMap (named), document `n` of the file (from 1).
    ConfigMap {
        /// `metadata.name`.
        name: String,
        /// Its document in the file.
        document: usize,
    },
}

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Configuration => f.write_str("a configuration file"),
            Self::HelmValues => f.write_str("the `config` value of a Helm values file"),
            Self::ConfigMap { name, document } => write!(
                f,
                "data.\"{CONFIGMAP_KEY}\" of ConfigMap {name} (document {document})"
            ),
        }
    }
}

/// Reads `path` as one of the three forms and parses the configuration in it.
pub fn load(path: &Path) -> Result<(Config, Found), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let (text, found) = configuration_in(&text)?;
    Ok((Config::parse(&text)?, found))
}

/// The configuration's text in `text`, and where it was. A file that is neither a values
/// file nor holds a ConfigMap is read as a configuration (its own errors say what is wrong).
pub fn configuration_in(text: &str) -> Result<(String, Found), ConfigError> {
    let invalid = |message: String| ConfigError::Invalid(vec![message]);
    crate::yaml_nesting::check(text).map_err(|e| invalid(format!("not valid YAML: {e}")))?;
    let mut documents = Vec::new();
    for document in yaml_serde::Deserializer::from_str(text) {
        match serde::Deserialize::deserialize(document) {
            Ok(value) => documents.push(value),
            // Not YAML, or YAML the configuration's own reading refuses: that says why.
            Err(_) => return Ok((text.to_string(), Found::Configuration)),
        }
    }
    let documents: Vec<(usize, Value)> = documents
        .into_iter()
        .enumerate()
        .filter(|(_, d): &(usize, Value)| !d.is_null())
        .map(|(i, d)| (i + 1, d))
        .collect();
    let config_maps: Vec<&(usize, Value)> = documents
        .iter()
        .filter(|(_, d)| d.get("kind").and_then(Value::as_str) == Some("ConfigMap"))
        .collect();
    if !config_maps.is_empty() {
        return in_config_maps(&config_maps);
    }
    // A configuration has no `config` key (config.rs refuses one as unknown); a values file
    // keeps the configuration under it.
    if let [(_, values)] = documents.as_slice()
        && let Some(config) = values.get("config")
    {
        if !config.is_mapping() && !config.is_null() {
            return Err(invalid(
                "config: the chart's `config` value must be a mapping (the configuration)"
                    .to_string(),
            ));
        }
        let text = yaml_serde::to_string(config)
            .map_err(|e| invalid(format!("config: cannot be written back as YAML: {e}")))?;
        return Ok((text, Found::HelmValues));
    }
    Ok((text.to_string(), Found::Configuration))
}

/// The configuration of the one ConfigMap (of `config_maps`, with their documents) that
/// has the chart's key.
fn in_config_maps(config_maps: &[&(usize, Value)]) -> Result<(String, Found), ConfigError> {
    let invalid = |message: String| ConfigError::Invalid(vec![message]);
    let with_key: Vec<&&(usize, Value)> = config_maps
        .iter()
        .filter(|(_, d)| d.get("data").and_then(|d| d.get(CONFIGMAP_KEY)).is_some())
        .collect();
    let name = |d: &Value| {
        d.get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("(no name)")
            .to_string()
    };
    match with_key.as_slice() {
        [(document, cm)] => {
            let found = Found::ConfigMap {
                name: name(cm),
                document: *document,
            };
            match cm.get("data").and_then(|d| d.get(CONFIGMAP_KEY)) {
                Some(Value::String(config)) => Ok((config.clone(), found)),
                _ => Err(invalid(format!(
                    "{found}: not a string (a ConfigMap's data values are strings)"
                ))),
            }
        }
        [] => Err(invalid(format!(
            "the file holds {} ConfigMap(s) ({}), none with a data key \"{CONFIGMAP_KEY}\" (the chart's)",
            config_maps.len(),
            config_maps
                .iter()
                .map(|(_, d)| name(d))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
        several => Err(invalid(format!(
            "the file holds {} ConfigMaps with a data key \"{CONFIGMAP_KEY}\" ({}): give one",
            several.len(),
            several
                .iter()
                .map(|(_, d)| name(d))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str =
        "profiles:\n  scratch: {mountPath: /scratch, emptyDir: {sizeLimit: 1Gi}}\n";

    #[test]
    fn a_configuration_is_read_as_it_is() {
        let (text, found) = configuration_in(CONFIG).unwrap();
        assert_eq!((text.as_str(), found), (CONFIG, Found::Configuration));
    }

    #[test]
    fn a_values_file_gives_its_config_value() {
        let values = format!(
            "replicaCount: 2\nconfig:\n{}",
            CONFIG
                .lines()
                .map(|l| format!("  {l}\n"))
                .collect::<String>()
        );
        let (text, found) = configuration_in(&values).unwrap();
        assert_eq!(found, Found::HelmValues);
        let cfg = Config::parse(&text).unwrap();
        assert!(cfg.profiles.contains_key("scratch"));
        assert!(matches!(
            configuration_in("config: [a]\n"),
            Err(ConfigError::Invalid(e)) if e[0].contains("must be a mapping")
        ));
    }

    #[test]
    fn a_rendered_configmap_gives_its_key_among_other_manifests() {
        let stream = format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: evi}}\n---\n# a comment\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: evi-config}}\ndata:\n  config.yaml: |\n{}",
            CONFIG
                .lines()
                .map(|l| format!("    {l}\n"))
                .collect::<String>()
        );
        let (text, found) = configuration_in(&stream).unwrap();
        assert_eq!(
            found,
            Found::ConfigMap {
                name: "evi-config".into(),
                document: 3
            }
        );
        assert_eq!(text, CONFIG);
        let other = "kind: ConfigMap\nmetadata: {name: dashboards}\ndata: {a: b}\n";
        assert!(matches!(
            configuration_in(other),
            Err(ConfigError::Invalid(e)) if e[0].contains("none with a data key \"config.yaml\"") && e[0].contains("dashboards")
        ));
        let two = format!(
            "{}---\n{}",
            stream.split("---\n").last().unwrap(),
            stream.split("---\n").last().unwrap()
        );
        assert!(matches!(
            configuration_in(&two),
            Err(ConfigError::Invalid(e)) if e[0].contains("2 ConfigMaps")
        ));
    }
}
