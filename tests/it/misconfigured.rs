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

/// Runs `companion <args>` with `vars` on top of the environment's, reading its stderr as it comes:
/// (exit ok, each stderr line with the time since the start).
async fn run_watched(
    env: &TestEnv,
    args: &[&str],
    vars: &[(&str, &str)],
) -> (bool, Vec<(Duration, String)>) {
    use tokio::io::AsyncBufReadExt;
    let mut cmd = tokio::process::Command::from(env.command(args));
    cmd.envs(vars.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let started = std::time::Instant::now();
    let mut child = cmd.spawn().expect("companion runs");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let read = async {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.push((started.elapsed(), line));
        }
        child.wait().await.expect("companion exits")
    };
    let status = tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("the command gives up by itself");
    (status.success(), seen)
}

/// The `N` of the final error's ` (N attempts)`, 1 when it has none.
fn attempts_in(line: &str) -> u32 {
    line.rsplit_once(" (")
        .and_then(|(_, tail)| tail.strip_suffix(" attempts)"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
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
            "nothing listening (connection refused)",
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
                attempts_in(last) >= 2,
                "{command}: the attempts are counted: {last}"
            );
            assert!(
                !err.contains("hunter2"),
                "no password in the output:\n{err}"
            );
            assert!(
                !err.contains("too old"),
                "no version check before a connection:\n{err}"
            );
            assert_eq!(
                err.matches(cause).count(),
                2,
                "{command}: the cause is logged once at the first attempt, then in the final error:\n{err}"
            );
        }
    }
    env.finish().await;
}

/// Each NATS misconfiguration is named in plain words at the first failed attempt (seconds after the
/// start, long before the connect window ends), then tried again quietly: the same cause is not logged
/// again, and the final error counts the attempts. Refused credentials end at once.
#[tokio::test]
async fn each_nats_misconfiguration_is_named_at_the_first_attempt_then_retried_quietly() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    let tmp = crate::servers::TempDir::new("companion-nats-auth");
    let [auth_port, monitor] = crate::servers::free_ports();
    let _auth = crate::servers::Server(
        std::process::Command::new(crate::servers::nats_server_bin())
            .args(["-a", "127.0.0.1", "-p", &auth_port.to_string()])
            .args([
                "-m",
                &monitor.to_string(),
                "--user",
                "jess",
                "--pass",
                "right",
            ])
            .args(["-js", "-sd"])
            .arg(tmp.0.join("js"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nats-server starts"),
    );
    assert!(crate::servers::nats_healthy(monitor).await);
    let pki = crate::tls::make_pki();
    let (_tls, tls_port, _) = crate::tls::start_nats(&pki, "verify: true").await;

    let refused = format!("nats://127.0.0.1:{}", closed_port());
    let http = format!("nats://127.0.0.1:{monitor}");
    let tls = format!("nats://localhost:{tls_port}");
    let auth = format!("nats://127.0.0.1:{auth_port}");
    let window = 8;
    // (url, NATS_USER, the cause as logged, final)
    let cases = [
        (refused, "", "nothing listening (connection refused)", false),
        (
            http,
            "",
            "not a NATS server: an HTTP server answered (`HTTP/1.",
            false,
        ),
        (
            tls,
            "",
            "TLS expected: the server requires TLS (its INFO says tls_required)",
            false,
        ),
        (auth, "jess", "authorization refused for user jess", true),
    ];
    let runs = cases.iter().map(|(url, user, cause, last)| {
        let env = &env;
        async move {
            let window = window.to_string();
            let mut vars = vec![
                ("NATS_URL", url.as_str()),
                ("NATS_CONNECT_WINDOW_SECS", window.as_str()),
            ];
            if !user.is_empty() {
                vars.extend([("NATS_USER", *user), ("NATS_PASSWORD", "pw-not-right-7d3")]);
            }
            let (ok, lines) = run_watched(env, &["provision"], &vars).await;
            (url, cause, *last, ok, lines)
        }
    });
    for (url, cause, last, ok, lines) in futures::future::join_all(runs).await {
        let text: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
        let all = text.join("\n");
        assert!(!ok, "{url}: provision fails:\n{all}");
        let (at, first) = lines
            .iter()
            .find(|(_, l)| l.contains(cause))
            .unwrap_or_else(|| panic!("{url}: the cause {cause:?} is named:\n{all}"));
        assert!(
            *at < Duration::from_secs(4),
            "{url}: named at the first failed attempt, not after the {window} s window ({at:?}): {first}"
        );
        let (ended, final_line) = lines.last().unwrap();
        assert!(
            final_line.contains(&format!("cannot connect to NATS at {url}: {cause}")),
            "{url}: the final error names the cause: {final_line}"
        );
        assert!(
            !all.contains("pw-not-right-7d3"),
            "no password in the output:\n{all}"
        );
        if last {
            assert!(
                *ended < Duration::from_secs(4) && attempts_in(final_line) == 1,
                "{url}: refused credentials end at once ({ended:?}):\n{all}"
            );
        } else {
            assert!(
                *ended >= Duration::from_secs(window - 1),
                "{url}: tried for the window ({ended:?}):\n{all}"
            );
            assert!(
                attempts_in(final_line) >= 3,
                "{url}: the attempts are counted: {final_line}"
            );
            assert_eq!(
                all.matches(cause).count(),
                2,
                "{url}: one line for the repeated cause, then the final error:\n{all}"
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
