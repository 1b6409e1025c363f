//! Streams and the shared consumer: a worker creates what is missing and never changes an existing
//! consumer (it logs each difference and goes by the consumer's settings); `companion provision` applies
//! the configuration.

use std::time::Duration;

use crate::env::*;
use companion_dev::stub::{StubReply, always};

#[tokio::test]
async fn a_worker_keeps_the_consumers_settings_and_provision_changes_them() {
    let env = TestEnv::with(always(StubReply::text("hi")), |c| {
        c.consumer.max_deliver = 2;
    })
    .await;
    // The operator provisions with max_deliver 2.
    let (ok, out, err) = env.run_companion(&["provision"]).await;
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!("consumer {}: created", env.config.consumer.name)),
        "{out}"
    );
    assert_eq!(env.consumer_info().await.unwrap().config.max_deliver, 2);

    // A worker configured with 4 leaves the consumer as it is, and says so.
    let mut worker = env.spawn_app_process(&[("COMPANION_MAX_DELIVER", "4")]);
    assert!(env.wait_worker_pulling(Duration::from_secs(60)).await);
    let event = env.dm(JESS, KAORI, JESS_KAORI, "still answered?").await;
    assert_eq!(env.turn(&event).await.content, "hi");
    assert_eq!(env.consumer_info().await.unwrap().config.max_deliver, 2);
    let log = worker.log();
    assert!(
        log.contains("max_deliver: 2 (consumer) vs 4 (configured)"),
        "the difference is logged:\n{log}"
    );
    assert!(
        log.contains("max_deliver=2"),
        "the worker goes by the consumer's:\n{log}"
    );
    stop(&mut worker);

    // `companion provision` with 4 applies it and says what changed.
    let mut cmd = tokio::process::Command::from(env.command(&["provision"]));
    cmd.env("COMPANION_MAX_DELIVER", "4");
    let out = cmd.output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("updated (max_deliver: 2 (consumer) vs 4 (configured))"),
        "{text}"
    );
    assert_eq!(env.consumer_info().await.unwrap().config.max_deliver, 4);
    // Provisioning the same again changes nothing.
    let mut cmd = tokio::process::Command::from(env.command(&["provision"]));
    cmd.env("COMPANION_MAX_DELIVER", "4");
    let out = cmd.output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("consumer {}: unchanged", env.config.consumer.name)),
        "{text}"
    );
    env.finish().await;
}
