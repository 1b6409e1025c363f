//! The operators' files, against a real Prometheus (Debian's, `deploy/local/prometheus.sh`) scraping a
//! real worker: the alert rules load, the dead-letter alert fires after a poison event while the worker
//! and readiness alerts stay quiet, the out-of-credits, service-budget and stale-crisis-lines alerts fire
//! when they should, and every query of the Grafana dashboard runs.

use std::{path::PathBuf, process::Command, time::Duration};

use companion_dev::stub::StubReply;
use serde_json::Value;

use crate::{env::*, servers::*};

/// `PROMETHEUS_BIN` (deploy/local/test.sh sets it), else `.local/prometheus/bin`.
fn prometheus_bin() -> PathBuf {
    let dir = std::env::var_os("PROMETHEUS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| local_dir().join("prometheus/bin"));
    assert!(
        dir.join("prometheus").is_file(),
        "Prometheus is not installed in {}: run deploy/local/prometheus.sh (deploy/local/test.sh does)",
        dir.display()
    );
    dir
}

/// The alert rules with every `for:` shortened to a second, so a test sees them fire.
fn quick_rules() -> String {
    let rules = std::fs::read_to_string(root().join("deploy/prometheus/alerts.yml")).unwrap();
    regex::Regex::new(r"for: \d+[smh]")
        .unwrap()
        .replace_all(&rules, "for: 1s")
        .into_owned()
}

async fn get_json(url: &str) -> Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

/// The result of a PromQL query.
async fn query(base: &str, expr: &str) -> Value {
    let url =
        url::Url::parse_with_params(&format!("{base}/api/v1/query"), [("query", expr)]).unwrap();
    get_json(url.as_str()).await
}

/// The alerts Prometheus has, by name, with their state.
async fn alerts(base: &str) -> Vec<(String, String)> {
    let v = get_json(&format!("{base}/api/v1/alerts")).await;
    v["data"]["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|a| {
            (
                a["labels"]["alertname"].as_str().unwrap_or("").to_owned(),
                a["state"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// Whether alert `name` is firing within a minute.
async fn fires(base: &str, name: &str) -> bool {
    eventually(Duration::from_secs(60), || async {
        alerts(base)
            .await
            .iter()
            .any(|(n, state)| n == name && state == "firing")
    })
    .await
}

/// Prometheus scraping `target` every second with [`quick_rules`], ready: the server, its base URL and
/// its folder (removed when dropped).
async fn prometheus(bin: &std::path::Path, target: &str) -> (Server, String, TempDir) {
    let dir = TempDir::new("companion-prometheus");
    std::fs::write(dir.0.join("alerts.yml"), quick_rules()).unwrap();
    std::fs::write(
        dir.0.join("prometheus.yml"),
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: [alerts.yml]\n\
             scrape_configs:\n  - job_name: companion\n    static_configs: [{{targets: ['{target}']}}]\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let prometheus = Server(
        Command::new(bin.join("prometheus"))
            .arg(format!(
                "--config.file={}",
                dir.0.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.0.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.0.join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus starts"),
    );
    let base = format!("http://127.0.0.1:{port}");
    assert!(
        eventually(Duration::from_secs(30), || async {
            reqwest::get(format!("{base}/-/ready"))
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await,
        "Prometheus is ready"
    );
    (prometheus, base, dir)
}

#[tokio::test]
async fn the_dead_letter_alert_fires_after_a_poison_event() {
    let bin = prometheus_bin();
    // The model answers, except the request that finds the account out of credits (402).
    let responder: companion_dev::stub::Responder = std::sync::Arc::new(|body: &Value| {
        if crate::env::last_message(body)
            .to_string()
            .contains("out of credits")
        {
            StubReply::Status {
                code: 402,
                body: r#"{"error":{"code":402,"message":"Insufficient credits"}}"#.into(),
                retry_after: None,
            }
        } else {
            StubReply::text("ok")
        }
    });
    // Crisis lines of which one was last checked in 2000: whatever today is, it is due for review.
    let lines_dir = TempDir::new("companion-crisis-lines");
    let lines_file = lines_dir.0.join("crisis.json");
    let mut lines: Value =
        serde_json::from_str(include_str!("../../crates/safety/src/crisis.json")).unwrap();
    lines["countries"]["US"][0]["checked"] = "2000-01-01".into();
    std::fs::write(&lines_file, lines.to_string()).unwrap();
    // A small service budget, read at every call, so a few priced answers cross 80% of it.
    let env = TestEnv::with(responder, |c| {
        c.spend.service_daily_usd = 0.05;
        c.spend.service_spend_refresh_secs = 0;
        c.safety.crisis_lines_file = lines_file.display().to_string();
    })
    .await;
    let worker = env.spawn_app().await;
    let target = worker.base.trim_start_matches("http://").to_owned();

    let (_prometheus, base, _dir) = prometheus(&bin, &target).await;
    // The worker is scraped: up, ready, and the dead-letter counter is there at 0.
    let scraped = eventually(Duration::from_secs(30), || async {
        let v = query(
            &base,
            r#"min(companion_ready{dependency!="model"}) + sum(companion_dead_letters_total) + min(up)"#,
        )
        .await;
        v["data"]["result"][0]["value"][1] == "2"
    })
    .await;
    assert!(
        scraped,
        "the worker is scraped, up and ready with no dead letter yet"
    );

    // A poison event: not JSON at all, on a real conversation's subject.
    env.publish_raw(
        env.bus.names.inbound(KAORI, JESS_KAORI),
        "poison-1",
        &b"{not json"[..],
    )
    .await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            env.dead_letters().await.len() == 1
        })
        .await,
        "the poison event is dead-lettered"
    );
    let fired = fires(&base, "CompanionDeadLetters").await;
    let now = alerts(&base).await;
    assert!(fired, "CompanionDeadLetters fires: {now:?}");
    for quiet in [
        "CompanionWorkerDown",
        "CompanionNotReady",
        "CompanionLlmErrorRatio",
        "CompanionServiceBudget80",
    ] {
        assert!(
            !now.iter().any(|(name, _)| name == quiet),
            "{quiet} stays quiet: {now:?}"
        );
    }

    // The account runs out of credits: the user gets the failure line, and the operator is paged.
    let broke = env
        .dm(JESS, KAORI, JESS_KAORI, "are we out of credits?")
        .await;
    let reply = env.turn(&broke).await;
    assert_eq!(reply.content, failure_line("kaori"));
    let paged = fires(&base, "CompanionOutOfCredits").await;
    assert!(
        paged,
        "CompanionOutOfCredits fires: {:?}",
        alerts(&base).await
    );

    // The service spends 90% of its budget: the next check reports it and the operator is told.
    env.stub.report_cost(Some(0.045));
    for text in ["a priced answer", "and the check that sees it"] {
        let e = env.dm(JESS, KAORI, JESS_KAORI, text).await;
        assert_eq!(env.turn(&e).await.content, "ok");
    }
    let warned = fires(&base, "CompanionServiceBudget80").await;
    assert!(
        warned,
        "CompanionServiceBudget80 fires: {:?}",
        alerts(&base).await
    );

    // The worker started with a crisis line due for review: the trust-and-safety lead is told.
    let stale = fires(&base, "CompanionCrisisLinesStale").await;
    assert!(
        stale,
        "CompanionCrisisLinesStale fires: {:?}",
        alerts(&base).await
    );
    let v = query(&base, "max(companion_crisis_lines_stale)").await;
    assert_eq!(v["data"]["result"][0]["value"][1], "1", "{v}");

    // Every query of the dashboard is valid PromQL that Prometheus runs against these metrics.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("deploy/grafana/companion-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            exprs.push(t["expr"].as_str().unwrap().to_owned());
        }
    }
    assert!(exprs.len() >= 10, "{exprs:?}");
    for expr in &exprs {
        let v = query(&base, expr).await;
        assert_eq!(v["status"], "success", "{expr}: {v}");
    }
    worker.stop().await;
    env.finish().await;
}

/// A worker whose encoder did not load still answers (`/readyz` is 200), but its crisis screen is
/// weakened: `CompanionCrisisScreenWeakened` fires and `CompanionNotReady` stays quiet.
#[tokio::test]
async fn a_worker_without_its_encoder_is_alerted_as_a_weakened_crisis_screen() {
    let bin = prometheus_bin();
    let empty = TempDir::new("companion-no-model");
    let responder: companion_dev::stub::Responder =
        std::sync::Arc::new(|_: &Value| StubReply::text("ok"));
    let env = TestEnv::with(responder, |c| {
        c.embed.model_dir = empty.0.clone();
    })
    .await;
    let worker = env.spawn_app().await;
    let target = worker.base.trim_start_matches("http://").to_owned();
    let (_prometheus, base, _dir) = prometheus(&bin, &target).await;
    let e = env.dm(JESS, KAORI, JESS_KAORI, "still there?").await;
    assert_eq!(
        env.turn(&e).await.content,
        "ok",
        "a turn goes on without the encoder"
    );
    let ready = reqwest::get(format!("{}/readyz", worker.base))
        .await
        .unwrap();
    assert!(ready.status().is_success(), "/readyz stays 200");
    let fired = fires(&base, "CompanionCrisisScreenWeakened").await;
    let now = alerts(&base).await;
    assert!(fired, "CompanionCrisisScreenWeakened fires: {now:?}");
    assert!(
        !now.iter().any(|(name, _)| name == "CompanionNotReady"),
        "CompanionNotReady stays quiet: {now:?}"
    );
    worker.stop().await;
    env.finish().await;
}
