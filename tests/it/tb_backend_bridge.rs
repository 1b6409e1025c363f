//! The TB-Backend integration guide cannot rot: its code (`deploy/tb-backend/dm-bridge.js`, nats.js)
//! publishes a DM with its `Nats-Msg-Id` and receives the worker's completion, against a real worker.

use crate::env::*;
use companion_dev::stub::{StubReply, always};
use serde_json::Value;

async fn bridge(env: &TestEnv, args: &[&str]) -> std::process::Output {
    let script = root().join("deploy/tb-backend/dm-bridge.js");
    assert!(
        root().join("deploy/tb-backend/node_modules/nats").exists(),
        "nats.js is not installed: run `npm ci --prefix deploy/tb-backend` (deploy/local/test.sh does)"
    );
    tokio::process::Command::new("node")
        .arg(script)
        .args(args)
        .env("NATS_URL", &env.config.nats.url)
        .env("COMPANION_SUBJECT_PREFIX", &env.config.nats.subject_prefix)
        .output()
        .await
        .expect("node runs")
}

#[tokio::test]
async fn the_guide_s_node_code_publishes_a_dm_and_gets_the_reply() {
    let mut env = TestEnv::new(always(StubReply::text("hey from kaori 🏔️"))).await;
    env.start_worker().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "sent from node").await;
    let json = serde_json::to_string(&event).unwrap();

    let out = bridge(&env, &["--timeout", "60", &json]).await;
    assert!(
        out.status.success(),
        "bridge failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let completion: Value =
        serde_json::from_slice(&out.stdout).expect("one JSON completion on stdout");
    assert_eq!(completion["inReplyTo"], event.message_id);
    assert_eq!(completion["senderId"], KAORI);
    assert_eq!(completion["conversationId"], JESS_KAORI);
    assert_eq!(completion["content"], "hey from kaori 🏔️");

    // The same event again is a duplicate for JetStream, and nothing more is answered.
    let again = bridge(&env, &["--no-wait", &json]).await;
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let ack: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(ack["duplicate"], true);
    assert_eq!(env.replies_to(&event.message_id).await.len(), 1);
    assert_eq!(env.stub.requests().len(), 1);
    env.finish().await;
}
