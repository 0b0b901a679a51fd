//! deploy/k8s passes an offline schema check (kubernetes-validate, which ships the Kubernetes
//! schemas; no cluster runs here), and the config it mounts is a valid `weir serve` config.

use std::path::PathBuf;
use weir_host::api::ServeSettings;
use weir_host::config::EnvVars;
use weir_tests::*;

fn manifests() -> Vec<PathBuf> {
    let dir = workspace_root().join("deploy/k8s");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/k8s exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        // kustomize's own file is not a Kubernetes resource.
        .filter(|p| p.file_name().is_some_and(|n| n != "kustomization.yaml"))
        .collect();
    files.sort();
    files
}

fn validate(files: &[PathBuf]) -> std::process::Output {
    std::process::Command::new(py_tool(
        "WEIR_K8S_VALIDATE",
        "k8s-validate",
        "kubernetes-validate",
    ))
    .arg("--strict")
    .args(files)
    .output()
    .expect("kubernetes-validate runs")
}

#[test]
fn the_kubernetes_manifests_pass_a_strict_schema_check() {
    let files = manifests();
    let names: Vec<String> = files
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    assert_eq!(
        names,
        [
            "configmap.yaml",
            "deployment.yaml",
            "hpa.yaml",
            "service.yaml"
        ]
    );
    let out = validate(&files);
    let report =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{report}");
    assert_eq!(
        report.matches(" passed for resource ").count(),
        4,
        "{report}"
    );
}

#[test]
fn the_schema_check_refuses_a_broken_manifest() {
    // The precondition of the test above: the checker really checks.
    let dir = tempfile_dir();
    let broken = dir.join("deployment.yaml");
    let text = std::fs::read_to_string(workspace_root().join("deploy/k8s/deployment.yaml"))
        .expect("readable")
        .replace("replicas: 2", "replicas: two");
    std::fs::write(&broken, text).expect("writable");
    let out = validate(&[broken]);
    assert!(!out.status.success(), "a string replica count must fail");
}

#[test]
fn the_mounted_serve_config_is_valid() {
    let configmap = std::fs::read_to_string(workspace_root().join("deploy/k8s/configmap.yaml"))
        .expect("readable");
    let toml: String = configmap
        .split_once("serve.toml: |\n")
        .expect("the ConfigMap holds serve.toml")
        .1
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect();
    let env = EnvVars::new([("AWS_REGION", "eu-west-1")]);
    let settings =
        ServeSettings::from_toml_with_env(&toml, &env).expect("a valid weir serve config");
    assert_eq!(settings.listen, "0.0.0.0:8080");
    assert_eq!(
        settings.store_options.get("aws_region").map(String::as_str),
        Some("eu-west-1")
    );
    // The repo's local config parses too.
    let local = std::fs::read_to_string(workspace_root().join("deploy/config/serve.toml"))
        .expect("readable");
    ServeSettings::from_toml_with_env(&local, &EnvVars::default())
        .expect("deploy/config/serve.toml is valid");
}

/// A fresh directory under the system temporary directory.
fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(unique("weir-k8s"));
    std::fs::create_dir_all(&dir).expect("creatable");
    dir
}
