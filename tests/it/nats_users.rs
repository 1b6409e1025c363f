//! The production NATS configuration (`deploy/nats/nats.conf` with the users of `auth.conf`) is enough
//! for a real worker: a `companion worker` process logged in as `companion-worker` sets up its streams
//! and consumers, answers a DM (and signals and schedules its memory extraction), follows up on a spot
//! review, dead-letters a malformed event, carries out a `user_erased` signal (purging the user's DM
//! subjects, deleting their group message and, found by a direct-get scan, their dead letter) and reads
//! its consumer's gauges, and the server records no permissions violation. (What each user may NOT do is
//! proven by `deploy/nats/test-permissions.sh`.) The test itself acts as TB-Backend and operator with
//! `admin`.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use crate::{env::*, servers::*};
use companion_core::config::Secret;
use companion_dev::{
    backend,
    stub::{StubReply, always},
};
use companion_store::bus::Bus;

/// Messages of `stream` whose payload names `user` as its sender (read as `admin`).
/// The model's answer in this file's turns.
const REPLY: &str = "you are logged in as the least privileged user the worker needs";

async fn sent_by(bus: &Bus, stream: &str, user: &str) -> Vec<u64> {
    let mut stream = bus.js.get_stream(stream).await.expect("stream");
    let state = stream.info().await.expect("stream info").state.clone();
    let needle = format!("\"senderId\":\"{user}\"");
    let mut found = Vec::new();
    for seq in state.first_sequence..=state.last_sequence {
        if let Ok(m) = stream.get_raw_message(seq).await
            && String::from_utf8_lossy(&m.payload).contains(&needle)
        {
            found.push(seq);
        }
    }
    found
}

#[tokio::test]
async fn a_real_worker_runs_as_the_least_privilege_user_without_violations() {
    let tmp = TempDir::new("companion-users");
    let dir = tmp.0.clone();
    for f in ["nats.conf", "auth.conf"] {
        std::fs::copy(root().join("deploy/nats").join(f), dir.join(f)).unwrap();
    }
    let pw = |who: &str| format!("{who}-{:016x}", fastrand::u64(..));
    let (worker_pw, admin_pw) = (pw("worker"), pw("admin"));
    let [port, monitor] = free_ports();
    let log_path = dir.join("nats.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let server = Server(
        Command::new(nats_server_bin())
            .arg("--config")
            .arg(dir.join("nats.conf"))
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .args(["-m", &monitor.to_string()])
            .env("COMPANION_NATS_STORE", dir.join("js"))
            .env("COMPANION_NATS_BACKEND_PASSWORD", pw("backend"))
            .env("COMPANION_NATS_WORKER_PASSWORD", &worker_pw)
            .env("COMPANION_NATS_ADMIN_PASSWORD", &admin_pw)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("nats-server starts"),
    );
    let _ = rustls::crypto::ring::default_provider().install_default();
    assert!(
        nats_healthy(monitor).await,
        "nats-server with deploy/nats/nats.conf is healthy"
    );

    // auth.conf names the default subjects, streams and consumer.
    let nats_url = format!("nats://127.0.0.1:{port}");
    let admin = admin_pw.clone();
    let env = TestEnv::with(
        // Not "least privilege, most helpful": the output check's reply head blocks that one (a false
        // positive, docs/safety.md), and this test is about NATS permissions.
        always(StubReply::text(REPLY)),
        |c| {
            c.nats.url = nats_url.clone();
            c.nats.user = Some("admin".into());
            c.nats.password = Secret::from(admin);
            c.nats.subject_prefix = "dm.bot".into();
            c.nats.stream_prefix = "DM_BOT".into();
            c.consumer.name = "companion-worker".into();
            // The first DM's turn signals its memory extraction at once (and schedules the quiet timer).
            c.memory.extract_after = 1;
        },
    )
    .await;
    let http = format!("127.0.0.1:{}", free_port());
    let mut worker = env.spawn_app_process(&[
        ("NATS_USER", "companion-worker"),
        ("NATS_PASSWORD", &worker_pw),
        ("COMPANION_HTTP_ADDR", &http),
    ]);

    let event = env
        .dm(JESS, KAORI, JESS_KAORI, "who am i logged in as?")
        .await;
    let reply = env.turn(&event).await;
    assert_eq!(reply.content, REPLY);

    env.publish_raw(
        env.bus.names.inbound(KAORI, JESS_KAORI),
        "junk-1",
        "{not json",
    )
    .await;
    assert!(
        eventually(Duration::from_secs(15), || async {
            env.dead_letters().await.len() == 1
        })
        .await,
        "the worker user dead-letters"
    );

    // A spot review: the worker user consumes the signal stream and sends the follow-up.
    let draft = bson::oid::ObjectId::new();
    env.mongo
        .collection("spot_drafts")
        .insert_one(bson::doc! {
            "_id": draft, "name": "Permit Park", "status": "rejected", "submittedBy": JESS,
            "botId": KAORI, "conversationId": JESS_KAORI,
        })
        .await
        .unwrap();
    let mut replies = env.completions(JESS_KAORI).await;
    env.publish_raw(
        env.bus.names.spot_review(&draft.to_hex()),
        &format!("{}:rejected", draft.to_hex()),
        serde_json::json!({"draftId": draft.to_hex(), "status": "rejected", "reviewedAt": "2026-11-23T10:00:00Z"})
            .to_string(),
    )
    .await;
    let follow_up = tokio::time::timeout(Duration::from_secs(30), async {
        use futures::StreamExt;
        loop {
            let c = replies.next().await.expect("completions");
            if c.proactive {
                return c;
            }
        }
    })
    .await
    .expect("the worker user sends the follow-up");
    assert_eq!(follow_up.content, REPLY);

    // TB-Backend erases Jess. Before: a group message of hers answered, and a malformed one
    // dead-lettered on the group's subject (found only by the dead-letter scan, by its sender).
    let group = backend::create_group(&env.mongo, &[oid(JESS)], &[oid(KAORI), oid(TONY)])
        .await
        .unwrap();
    let said = backend::store_group_message(&env.mongo, group, oid(JESS), "kaori, tony: hi!")
        .await
        .unwrap();
    backend::publish_group_message(&env.bus, &said)
        .await
        .unwrap();
    let group_seq = env
        .settled(&said.message_id)
        .await
        .stream_seq
        .expect("the group job knows its sequence");
    let junk = serde_json::json!({"messageId": bson::oid::ObjectId::new().to_hex(),
        "conversationId": group.to_hex(), "senderId": JESS, "content": 42, "sentAt": "2026-11-27T10:00:00Z"});
    env.publish_raw(
        env.bus.names.group(&group.to_hex()),
        "junk-2",
        junk.to_string(),
    )
    .await;
    let dlq = env.bus.names.stream_dlq.clone();
    assert!(
        eventually(Duration::from_secs(15), || async {
            sent_by(&env.bus, &dlq, JESS).await.len() == 1
        })
        .await,
        "the malformed group message is dead-lettered"
    );

    env.signal("user_erased", JESS, &format!("erased:{JESS}"), "")
        .await;
    let history = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM bot_conversations WHERE user_id = $1")
            .bind(JESS)
            .fetch_one(&env.pg.pool)
            .await
            .unwrap()
    };
    let dm_out = env.bus.names.outbound(JESS_KAORI);
    let erased = eventually(Duration::from_secs(30), || async {
        history().await == 0
            && sent_by(&env.bus, &dlq, JESS).await.is_empty()
            && worker.log().contains("deletion carried out")
    })
    .await;
    assert!(
        erased,
        "the worker user erases Jess: {} history rows, dead letters {:?}\n{}",
        history().await,
        sent_by(&env.bus, &dlq, JESS).await,
        worker.log()
    );
    let stream = env
        .bus
        .js
        .get_stream(&env.bus.names.stream_in)
        .await
        .unwrap();
    assert!(
        stream.get_raw_message(group_seq).await.is_err(),
        "her group message is deleted"
    );
    assert_eq!(
        sent_by(&env.bus, &env.bus.names.stream_in, JESS).await,
        Vec::<u64>::new(),
        "nothing she sent is left in the inbound stream (the malformed one found through its dead letter)"
    );
    let inbound = env.bus.names.inbound(KAORI, JESS_KAORI);
    assert!(
        stream
            .get_last_raw_message_by_subject(&inbound)
            .await
            .is_err(),
        "her DM conversation's inbound subject is purged"
    );
    let out = env
        .bus
        .js
        .get_stream(&env.bus.names.stream_out)
        .await
        .unwrap();
    assert!(
        out.get_last_raw_message_by_subject(&dm_out).await.is_err(),
        "and its completions"
    );
    let mut dlq_stream = env.bus.js.get_stream(&dlq).await.unwrap();
    assert_eq!(
        dlq_stream.info().await.unwrap().state.messages,
        0,
        "and the dead letters (the DM's purged, the group's found by sender and deleted)"
    );

    let metrics = get_text(&format!("http://{http}/metrics")).await;
    assert!(
        metrics.contains(
            "companion_consumer_ack_pending{stream=\"DM_BOT_IN\",consumer=\"companion-worker\"} "
        ),
        "the worker user reads its consumer's info: {metrics}"
    );
    let ready = reqwest::get(format!("http://{http}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200);

    sigterm(&worker);
    let status = wait_exit(&mut worker, Duration::from_secs(30)).await;
    assert!(status.success(), "{status}");
    env.finish().await;
    drop(server);
    let log = std::fs::read_to_string(&log_path).unwrap();
    // nats-server logs "Publish Violation" / "Subscription Violation" for every denied operation.
    assert!(
        !log.to_lowercase().contains("violation"),
        "no permissions violation in the server log:\n{log}"
    );
}
