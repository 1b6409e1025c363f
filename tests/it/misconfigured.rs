//! A server that is not there, or a URL that is wrong: each command says which server, at which address
//! (never with its password), and the cause, instead of a timeout or a check that read nothing.

use std::time::Duration;

use crate::env::*;
use companion_dev::stub::{StubReply, always};

/// A local port nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Runs `companion <args>` with `env` set on top of the environment's; (exit ok, stderr).
async fn run_with(env: &TestEnv, args: &[&str], vars: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = tokio::process::Command::from(env.command(args));
    cmd.envs(vars.iter().copied());
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the command gives up by itself")
        .expect("companion runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn an_unreachable_nats_is_named_with_its_address_and_cause_after_the_connect_window() {
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    let port = closed_port();
    let refused = format!("nats://jess:hunter2@127.0.0.1:{port}");
    let cases = [
        (
            refused.as_str(),
            format!("cannot connect to NATS at nats://jess:***@127.0.0.1:{port}: "),
            "refused",
        ),
        (
            "nats://no-such-host.invalid:4222",
            "cannot connect to NATS at nats://no-such-host.invalid:4222: ".to_owned(),
            "lookup",
        ),
    ];
    for command in ["worker", "provision"] {
        for (url, names, cause) in &cases {
            let vars = [("NATS_URL", *url), ("NATS_CONNECT_WINDOW_SECS", "3")];
            let (ok, err) = run_with(&env, &[command], &vars).await;
            assert!(!ok, "{command} with {url} fails");
            let last = err.lines().last().unwrap_or_default();
            assert!(last.contains(names.as_str()), "{command}: {last}");
            assert!(last.contains(cause), "{command}: the cause: {last}");
            assert!(
                !err.contains("hunter2"),
                "no password in the output:\n{err}"
            );
            assert!(
                !err.contains("too old"),
                "no version check before a connection:\n{err}"
            );
            assert!(
                err.matches("NATS does not answer; trying again").count() >= 1,
                "each attempt is logged:\n{err}"
            );
        }
    }
    env.finish().await;
}

#[tokio::test]
async fn an_unusable_postgres_is_named_with_its_address_and_the_servers_reason() {
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    let url = url::Url::parse(&env.config.pg.url).unwrap();
    let with = |f: &dyn Fn(&mut url::Url)| {
        let mut u = url.clone();
        f(&mut u);
        u.to_string()
    };
    let port = closed_port();
    let refused = with(&|u| u.set_port(Some(port)).unwrap());
    let wrong_password = with(&|u| u.set_password(Some("not-the-password")).unwrap());
    let no_database = with(&|u| u.set_path("/no_such_database"));
    let user = url.username();
    let cases = [
        (
            refused,
            format!("cannot connect to PostgreSQL at {user}@127.0.0.1:{port}/"),
            "refused",
        ),
        (
            wrong_password,
            format!("cannot connect to PostgreSQL at {user}@"),
            "password authentication failed",
        ),
        (
            no_database,
            format!("cannot connect to PostgreSQL at {user}@"),
            "\"no_such_database\" does not exist",
        ),
    ];
    for (pg, names, cause) in &cases {
        let (ok, err) = run_with(&env, &["migrate"], &[("POSTGRES_URL", pg.as_str())]).await;
        assert!(!ok);
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.contains(names.as_str()) && last.contains(cause),
            "{last}"
        );
        assert!(
            !last.contains(" at line "),
            "no source line of the server's: {last}"
        );
        assert!(
            !err.contains("not-the-password"),
            "no password in the output:\n{err}"
        );
    }
    env.finish().await;
}

#[tokio::test]
async fn the_terminal_chat_names_the_server_that_did_not_answer() {
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    let port = closed_port();
    let mut config = companion_dev::chat::ChatConfig {
        nats: env.config.nats.clone(),
        mongo: env.config.mongo.clone(),
        pg: env.config.pg.clone(),
        characters: env.config.characters.clone(),
        raw_cards: false,
        ids: false,
    };
    config.nats.url = format!("nats://127.0.0.1:{port}");
    config.nats.connect_window_secs = 1;
    let err = companion_dev::chat::Session::open(&config, "jess", "kaori")
        .await
        .err()
        .expect("no NATS, no chat")
        .to_string();
    assert!(
        err.contains(&format!(
            "cannot connect to NATS at nats://127.0.0.1:{port}: "
        )),
        "{err}"
    );
    config.nats.url = env.config.nats.url.clone();
    config.pg.url = {
        let mut u = url::Url::parse(&env.config.pg.url).unwrap();
        u.set_port(Some(port)).unwrap();
        u.to_string()
    };
    let err = companion_dev::chat::Session::open(&config, "jess", "kaori")
        .await
        .err()
        .expect("no PostgreSQL, no chat")
        .to_string();
    assert!(
        err.contains("cannot connect to PostgreSQL at") && err.contains("refused"),
        "{err}"
    );
    env.finish().await;
}
