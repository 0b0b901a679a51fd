//! The multi-tenant HTTP API (`weir serve`) against the S3 server: two tenants' whole
//! lifecycle, every cross-tenant attempt answering 404, bad uploads answering 4xx problems that
//! name what is wrong, and the OpenAPI document.

use reqwest::{Method, StatusCode};
use serde_json::json;
use weir_tests::api::*;
use weir_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_each_see_only_their_own_operators() -> anyhow::Result<()> {
    let addr = start_server().await?;
    let acme = tenant_with_key(addr, "acme").await?;
    let globex = tenant_with_key(addr, "globex").await?;
    let wasm = counter_component();

    // acme uploads two versions of `counter`.
    for expected_version in [1, 2] {
        let (status, _, version) = call(
            addr,
            Method::POST,
            "/v1/operators/counter",
            Some(&acme),
            Some(("application/wasm", wasm.clone())),
        )
        .await?;
        assert_eq!(status, StatusCode::CREATED, "{version}");
        assert_eq!(version["version"], expected_version);
        assert_eq!(version["declared_name"], "counter");
        assert_eq!(version["size_bytes"], wasm.len());
        assert_eq!(version["states"][0]["name"], "count");
        assert_eq!(version["states"][0]["kind"], "value");
    }
    let (status, _, list) = call(addr, Method::GET, "/v1/operators", Some(&acme), None).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list, json!([{"name": "counter", "versions": [1, 2]}]));

    // globex sees none of it, and every attempt at acme's operator is a 404.
    let (status, _, list) = call(addr, Method::GET, "/v1/operators", Some(&globex), None).await?;
    assert_eq!((status, list), (StatusCode::OK, json!([])));
    for (method, path) in [
        (Method::GET, "/v1/operators/counter"),
        (Method::GET, "/v1/operators/counter/versions/1"),
        (Method::DELETE, "/v1/operators/counter/versions/1"),
    ] {
        let (status, content_type, problem) =
            call(addr, method.clone(), path, Some(&globex), None).await?;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {problem}");
        assert_eq!(content_type, "application/problem+json");
        assert_eq!(problem["status"], 404);
    }
    // globex's own `counter` is its version 1, independent of acme's.
    let (status, _, version) = call(
        addr,
        Method::POST,
        "/v1/operators/counter",
        Some(&globex),
        Some(("application/wasm", wasm.clone())),
    )
    .await?;
    assert_eq!(
        (status, version["version"].clone()),
        (StatusCode::CREATED, json!(1))
    );

    // acme reads and deletes its version 1; version 2 stays.
    let (status, _, version) = call(
        addr,
        Method::GET,
        "/v1/operators/counter/versions/2",
        Some(&acme),
        None,
    )
    .await?;
    assert_eq!(
        (status, version["version"].clone()),
        (StatusCode::OK, json!(2))
    );
    let (status, _, _) = call(
        addr,
        Method::DELETE,
        "/v1/operators/counter/versions/1",
        Some(&acme),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, versions) = call(
        addr,
        Method::GET,
        "/v1/operators/counter",
        Some(&acme),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(versions.as_array().map(Vec::len), Some(1));
    assert_eq!(versions[0]["version"], 2);

    // Keys and roles.
    let (status, _, _) = call(addr, Method::GET, "/v1/operators", None, None).await?;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = call(
        addr,
        Method::GET,
        "/v1/operators",
        Some("weir_not-a-key"),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = call(addr, Method::GET, "/v1/tenants", Some(&acme), None).await?;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a tenant key is not the admin key"
    );
    let (status, _, _) = call(addr, Method::GET, "/v1/operators", Some(ADMIN_KEY), None).await?;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "the admin key acts for no tenant"
    );
    let (status, _, tenants) =
        call(addr, Method::GET, "/v1/tenants", Some(ADMIN_KEY), None).await?;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = tenants
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert_eq!(ids, ["acme", "globex"]);
    let (status, _, _) = call(
        addr,
        Method::POST,
        "/v1/tenants",
        Some(ADMIN_KEY),
        json_body(&json!({"id": "acme"})),
    )
    .await?;
    assert_eq!(status, StatusCode::CONFLICT);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_uploads_answer_4xx_naming_the_problem() -> anyhow::Result<()> {
    let addr = start_server().await?;
    let key = tenant_with_key(addr, "initech").await?;
    let cases: [(&str, Vec<u8>, StatusCode, &str); 5] = [
        (
            "not wasm",
            b"#!/bin/sh\necho hello\n".to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "not WebAssembly",
        ),
        (
            "a core module",
            b"\0asm\x01\0\0\0".to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "core WebAssembly module, not a component",
        ),
        (
            "a component of another world",
            b"\0asm\x0d\0\x01\0".to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "weir:operator",
        ),
        (
            "an oversized file",
            vec![0u8; OPERATOR_BYTES_MAX + 1],
            StatusCode::PAYLOAD_TOO_LARGE,
            "larger than 33554432 bytes",
        ),
        (
            "an empty body",
            Vec::new(),
            StatusCode::BAD_REQUEST,
            "empty",
        ),
    ];
    for (what, bytes, want_status, want_detail) in cases {
        let (status, content_type, problem) = call(
            addr,
            Method::POST,
            "/v1/operators/bad",
            Some(&key),
            Some(("application/wasm", bytes)),
        )
        .await?;
        assert_eq!(status, want_status, "{what}: {problem}");
        assert_eq!(content_type, "application/problem+json", "{what}");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(want_detail),
            "{what}: detail `{detail}` should name `{want_detail}`"
        );
    }
    // Nothing was stored.
    let (_, _, list) = call(addr, Method::GET, "/v1/operators", Some(&key), None).await?;
    assert_eq!(list, json!([]));
    // A bad operator name and bad JSON are 400s too.
    let (status, _, _) = call(
        addr,
        Method::POST,
        "/v1/operators/Bad%20Name",
        Some(&key),
        Some(("application/wasm", counter_component())),
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, problem) = call(
        addr,
        Method::POST,
        "/v1/tenants",
        Some(ADMIN_KEY),
        Some(("application/json", b"{not json".to_vec())),
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_describes_every_route() -> anyhow::Result<()> {
    let addr = start_server().await?;
    let (status, _, doc) = call(addr, Method::GET, "/openapi.json", None, None).await?;
    assert_eq!(status, StatusCode::OK);
    assert!(
        doc["openapi"]
            .as_str()
            .unwrap_or_default()
            .starts_with("3.")
    );
    for path in [
        "/v1/tenants",
        "/v1/tenants/{tenant}/api-keys",
        "/v1/operators",
        "/v1/operators/{name}",
        "/v1/operators/{name}/versions/{version}",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is documented");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    // Every authenticated route documents its 401 and 403 problems.
    let operators = &doc["paths"]["/v1/operators"]["get"]["responses"];
    for status in ["401", "403"] {
        assert!(
            operators[status]["content"]["application/problem+json"].is_object(),
            "{status}: {operators}"
        );
    }
    let (status, content_type, _) = call(addr, Method::GET, "/no/such/route", None, None).await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(content_type, "application/problem+json");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_server_error_and_no_response_breaking_the_schema()
-> anyhow::Result<()> {
    let st = py_tool("WEIR_SCHEMATHESIS", "schemathesis", "st");
    let addr = start_server().await?;
    let key = tenant_with_key(addr, "fuzz").await?;
    // One operator, so that reads of existing resources are exercised too.
    let (status, _, _) = call(
        addr,
        Method::POST,
        "/v1/operators/counter",
        Some(&key),
        Some(("application/wasm", counter_component())),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED);
    let output = tokio::process::Command::new(&st)
        .arg("run")
        .arg(format!("http://{addr}/openapi.json"))
        .args(["-H", &format!("Authorization: Bearer {key}")])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            "--max-examples",
            // A slice in the short tier.
            &tiered(20, 50).to_string(),
            "--seed",
            "20261130",
            "--request-timeout",
            "30",
        ])
        .env("NO_COLOR", "1")
        // Its cache directory (`.schemathesis/`) goes there, not into the repository.
        .current_dir(std::env::temp_dir())
        .output()
        .await?;
    let report = String::from_utf8_lossy(&output.stdout);
    let generated = report
        .lines()
        .find(|l| l.contains(" generated, "))
        .unwrap_or_default()
        .trim()
        .to_owned();
    assert!(
        output.status.success(),
        "schemathesis found problems:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The precondition: it really generated and sent requests.
    assert!(
        generated.contains("passed") && !generated.starts_with("0 "),
        "no test cases ran: {generated}"
    );
    eprintln!("schemathesis: {generated}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_client_pushes_lists_and_removes_and_reports_problems() -> anyhow::Result<()> {
    use weir_cli::client::{ApiClient, ClientError, operators_table, versions_table};
    let addr = start_server().await?;
    let base = format!("http://{addr}");
    let admin = ApiClient::new(&base, ADMIN_KEY);
    admin.create_tenant("hooli", Some("Hooli")).await?;
    let key = admin.create_api_key("hooli").await?;
    let client = ApiClient::new(&base, &key.key);

    let pushed = client.push_operator("counter", counter_component()).await?;
    assert_eq!(pushed.version, 1);
    let table = versions_table(&client.operator_versions("counter").await?);
    assert!(table.contains("counter 0.1.0"), "{table}");
    assert!(table.contains("count:value"), "{table}");
    let table = operators_table(&client.operators().await?);
    assert_eq!(
        table
            .lines()
            .nth(1)
            .map(str::split_whitespace)
            .map(Iterator::collect::<Vec<_>>),
        Some(vec!["counter", "1"])
    );

    client.delete_operator_version("counter", 1).await?;
    assert!(client.operators().await?.is_empty());
    match client.operator_versions("counter").await {
        Err(ClientError::Problem {
            status: 404,
            detail,
            ..
        }) => {
            assert!(detail.contains("counter"), "{detail}");
        }
        other => panic!("expected a 404 problem, got {other:?}"),
    }
    match client.push_operator("bad", b"not wasm".to_vec()).await {
        Err(ClientError::Problem {
            status: 422,
            detail,
            ..
        }) => {
            assert!(detail.contains("not WebAssembly"), "{detail}");
        }
        other => panic!("expected a 422 problem, got {other:?}"),
    }
    Ok(())
}

/// The README's Python path: a component built by componentize-py from the Python SDK uploads
/// like a Rust one (compiled and described by the server), states and all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_operator_uploads_like_a_rust_one() -> anyhow::Result<()> {
    let addr = start_server().await?;
    let acme = tenant_with_key(addr, "acme").await?;
    let wasm = std::fs::read(guest("flight_delays_py"))?;
    let (status, _, version) = call(
        addr,
        Method::POST,
        "/v1/operators/flights-py",
        Some(&acme),
        Some(("application/wasm", wasm.clone())),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    assert_eq!(version["version"], 1);
    assert_eq!(version["declared_name"], "flight-delays");
    assert_eq!(version["declared_version"], "0.1.0");
    assert_eq!(version["size_bytes"], wasm.len());
    assert_eq!(
        version["states"],
        json!([{"name": "route-stats", "kind": "value", "ttl_ms": null, "version": 0}])
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_readyz_answer_and_readiness_reports_but_ignores_the_brokers()
-> anyhow::Result<()> {
    // A host that runs pipelines against a broker that is not there: still ready (the catalog
    // store answers), with the brokers' state and cause in the body.
    let mut runner = runner_config(&unique("host"));
    runner.bootstrap_servers = "127.0.0.1:1".into();
    let (addr, _) = start_server_with(Some(runner)).await?;
    let healthz = reqwest::get(format!("http://{addr}/healthz")).await?;
    assert_eq!(healthz.status(), StatusCode::OK);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (status, _, body) = call(addr, Method::GET, "/readyz", None, None).await?;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["store"], "ok", "{body}");
        if body["kafka"]["reachable"] == json!(false) {
            assert!(
                body["kafka"]["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("127.0.0.1:1")),
                "the cause names the broker: {body}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no probe result: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // The real broker: reachable.
    let (addr, _) = start_server_with(Some(runner_config(&unique("host")))).await?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (status, _, body) = call(addr, Method::GET, "/readyz", None, None).await?;
        assert_eq!(status, StatusCode::OK, "{body}");
        if body["kafka"]["reachable"] == json!(true) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the broker never reachable: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    Ok(())
}
