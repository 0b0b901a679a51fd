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
