//! The TB-Backend integration guide cannot rot: its code (`deploy/tb-backend/dm-bridge.js`, nats.js)
//! publishes a DM with its `Nats-Msg-Id` and receives the worker's completion, against a real worker;
//! its other publishers (spot review, group message, a user's erasure) reach the worker too.

use crate::env::*;
use companion_dev::stub::{StubReply, always};
use serde_json::Value;

/// Runs the guide's bridge with `args` against this environment.
pub(crate) async fn bridge(env: &TestEnv, args: &[&str]) -> std::process::Output {
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
    let env = TestEnv::new(always(StubReply::text("hey from kaori 🏔️"))).await;
    env.spawn_app().await;
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

#[tokio::test]
async fn the_guide_s_node_code_publishes_a_spot_review_and_gets_the_follow_up() {
    let env = TestEnv::new(always(StubReply::text("your spot made it!! 🎉"))).await;
    env.spawn_app().await;
    // A draft Kaori made in Jess's thread, approved by the admin tool (status and spotId stored first).
    let (draft, spot) = (bson::oid::ObjectId::new(), bson::oid::ObjectId::new());
    env.mongo
        .collection("spot_drafts")
        .insert_one(bson::doc! {
            "_id": draft, "name": "Node Ledge", "status": "approved", "spotId": spot,
            "submittedBy": JESS, "botId": KAORI, "conversationId": JESS_KAORI, "createdBy": "Kaori",
        })
        .await
        .unwrap();
    let review = serde_json::json!({
        "draftId": draft.to_hex(), "status": "approved", "spotId": spot.to_hex(),
        "reviewedAt": "2026-11-23T10:00:00Z",
    })
    .to_string();

    let out = bridge(&env, &["--spot-review", "--timeout", "60", &review]).await;
    assert!(
        out.status.success(),
        "bridge failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let completion: Value = serde_json::from_slice(&out.stdout).expect("one JSON completion");
    assert_eq!(completion["proactive"], true);
    assert_eq!(completion["trigger"]["kind"], "spot_review");
    assert_eq!(
        completion["trigger"]["id"],
        format!("{}:approved", draft.to_hex())
    );
    assert_eq!(completion["conversationId"], JESS_KAORI);
    assert_eq!(completion["senderId"], KAORI);
    assert_eq!(completion["content"], "your spot made it!! 🎉");
    assert_eq!(
        completion["richContent"]["data"]["deepLink"],
        format!("trickbook://spot/{}", spot.to_hex())
    );
    assert!(completion.get("inReplyTo").is_none(), "{completion}");

    // The same outcome again is a duplicate for JetStream.
    let again = bridge(&env, &["--spot-review", "--no-wait", &review]).await;
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let ack: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(ack["duplicate"], true);
    // A review the bridge's own check refuses never reaches NATS.
    let bad = bridge(
        &env,
        &[
            "--spot-review",
            "--no-wait",
            r#"{"draftId":"x","status":"approved","reviewedAt":"now"}"#,
        ],
    )
    .await;
    assert_eq!(bad.status.code(), Some(2));
    assert_eq!(env.stub.requests().len(), 1);
    env.finish().await;
}

#[tokio::test]
async fn the_guide_s_node_code_publishes_a_group_message_once_and_prints_every_answer() {
    let named = std::sync::Arc::new(|body: &Value| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        let who = system
            .strip_prefix("You are ")
            .and_then(|s| s.split([' ', ',']).next())
            .unwrap_or_default()
            .to_lowercase();
        StubReply::text(format!("{who} says hi"))
    });
    let env = TestEnv::new(named).await;
    env.spawn_app().await;
    let conv =
        companion_dev::backend::create_group(&env.mongo, &[oid(JESS)], &[oid(KAORI), oid(TONY)])
            .await
            .unwrap();
    let event = companion_dev::backend::store_group_message(
        &env.mongo,
        conv,
        oid(JESS),
        "kaori and tony, hi!",
    )
    .await
    .unwrap();
    let json = serde_json::to_string(&event).unwrap();
    let out = bridge(&env, &["--group", "--timeout", "60", &json]).await;
    assert!(
        out.status.success(),
        "bridge failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON completion per line"))
        .collect();
    let said: Vec<(&str, &str)> = lines
        .iter()
        .map(|c| {
            (
                c["senderId"].as_str().unwrap(),
                c["content"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(said, [(KAORI, "kaori says hi"), (TONY, "tony says hi")]);
    assert!(lines.iter().all(|c| c["respondsTo"] == event.message_id));

    // A group message with a botId is refused before anything is published.
    let mut with_bot: Value = serde_json::from_str(&json).unwrap();
    with_bot["botId"] = KAORI.into();
    let out = bridge(&env, &["--group", &with_bot.to_string()]).await;
    assert_eq!(out.status.code(), Some(2));
    env.finish().await;
}

#[tokio::test]
async fn the_guide_s_node_code_erases_a_user_and_the_worker_removes_their_history() {
    let env = TestEnv::new(always(StubReply::text("noted"))).await;
    env.spawn_app().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "erase me later").await;
    env.turn(&event).await;
    let history = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM bot_conversations WHERE user_id = $1")
            .bind(JESS)
            .fetch_one(&env.pg.pool)
            .await
            .unwrap()
    };
    assert!(history().await > 0);

    let erase = serde_json::json!({ "userId": JESS }).to_string();
    let out = bridge(&env, &["--user-erased", &erase]).await;
    assert!(
        out.status.success(),
        "bridge failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ack: Value = serde_json::from_slice(&out.stdout).expect("the PubAck as JSON");
    assert_eq!(ack["stream"], env.bus.names.stream_signal.as_str());
    assert_eq!(
        ack["subject"],
        format!("{}.signal.user_erased.{JESS}", env.bus.names.prefix)
    );
    assert_eq!(ack["msgID"], format!("erased:{JESS}"));
    let gone = eventually(std::time::Duration::from_secs(30), || async {
        history().await == 0
    })
    .await;
    assert!(gone, "{} history rows left", history().await);
    let (ok, shown, _) = env.run_companion(&["memory", "--user", JESS]).await;
    assert!(ok && shown.contains("erased"), "{shown}");

    // The same erasure again is a duplicate for JetStream; a user id that is not 24 hex never reaches NATS.
    let again = bridge(&env, &["--user-erased", &erase]).await;
    let ack: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(ack["duplicate"], true);
    let bad = bridge(&env, &["--user-erased", r#"{"userId":"jess"}"#]).await;
    assert_eq!(bad.status.code(), Some(2));
    env.finish().await;
}
