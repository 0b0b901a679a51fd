//! The command line itself: shell completions, and policies and delivery modes as value enums
//! (a wrong one is refused with the possible values, before any request is made).

use tokio::process::Command;

async fn weir(args: &[&str]) -> anyhow::Result<std::process::Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .env_remove("WEIR_API_KEY")
        .output()
        .await?)
}

#[tokio::test]
async fn completions_cover_every_command_for_bash_zsh_and_fish() -> anyhow::Result<()> {
    for shell in ["bash", "zsh", "fish"] {
        let out = weir(&["completions", shell]).await?;
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8(out.stdout)?;
        for word in [
            "serve",
            "pipeline",
            "tenant",
            "failure-policy",
            "exactly_once",
        ] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_wrong_failure_policy_is_refused_with_the_possible_values() -> anyhow::Result<()> {
    let out = weir(&[
        "pipeline",
        "create",
        "p",
        "--operator",
        "counter:1",
        "--input",
        "in",
        "--output",
        "out",
        "--dead-letter",
        "dlq",
        "--failure-policy",
        "ignore",
    ])
    .await?;
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr)?;
    assert!(
        stderr.contains("invalid value 'ignore'")
            && stderr.contains("dead_letter")
            && stderr.contains("skip")
            && stderr.contains("fail"),
        "{stderr}"
    );
    Ok(())
}

/// `weir state get`'s record key is the record key, never the API key (which `--key` and
/// `WEIR_API_KEY` give): the request carries both where they belong.
#[tokio::test]
async fn state_get_sends_the_record_key_as_the_key_and_the_api_key_as_the_bearer()
-> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let api = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await?;
        let mut request = vec![0u8; 8192];
        let n = socket.read(&mut request).await?;
        let body = r#"{"state":"count","checkpoints":[{"partition":0,"version":3}],"entries":[{"key":"my key","value_b64":"Nw==","value":7,"partition":0}]}"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(answer.as_bytes()).await?;
        anyhow::Ok(String::from_utf8_lossy(&request[..n]).into_owned())
    });
    let out = weir(&[
        "state",
        "get",
        "p",
        "count",
        "my key",
        "--api",
        &api,
        "--key",
        "secret-api-key",
    ])
    .await?;
    let request = server.await??;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first_line = request.lines().next().unwrap_or_default();
    assert!(
        first_line.starts_with("GET /v1/pipelines/p/state/count?key=my+key "),
        "{first_line}"
    );
    assert!(
        request
            .to_ascii_lowercase()
            .contains("authorization: bearer secret-api-key"),
        "{request}"
    );
    assert_eq!(String::from_utf8(out.stdout)?, "my key\t7\n");
    Ok(())
}

/// `weir operator ls | head -0`: the reader is gone before the table is written; the command
/// ends quietly with success, as `cat` would, instead of panicking on the broken pipe.
#[tokio::test]
async fn a_command_whose_reader_went_away_ends_quietly() -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let api = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await?;
        let mut request = vec![0u8; 8192];
        let _ = socket.read(&mut request).await?;
        let body = r#"[{"name":"counter","versions":[1,2]}]"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(answer.as_bytes()).await?;
        anyhow::Ok(())
    });
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["operator", "ls", "--api", &api, "--key", "k"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    drop(child.stdout.take());
    let out = child.wait_with_output().await?;
    server.await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    Ok(())
}
