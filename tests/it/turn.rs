//! The walking skeleton end to end: an event on JetStream becomes one reply in dm_messages, two history
//! rows and one completion, against the real NATS, PostgreSQL and MongoDB-wire servers.

use std::time::Duration;

use crate::env::*;
use bson::{Bson, doc};
use companion::testing::pipeline;
use companion_dev::stub::{StubReply, always, scripted};
use companion_journal::{NewJob, State};
use futures::StreamExt;
use serde_json::Value;
use sqlx::Row;

#[tokio::test]
async fn an_event_becomes_one_reply_two_history_rows_and_one_completion() {
    let env = TestEnv::new(always(StubReply::text("omg yes!! send me a clip 🔥"))).await;
    env.spawn_app().await;
    let mut typing = env
        .bus
        .client
        .subscribe(env.bus.names.typing(JESS_KAORI))
        .await
        .unwrap();
    let event = env
        .dm(JESS, KAORI, JESS_KAORI, "just landed my first kickflip!!")
        .await;
    let completion = env.turn(&event).await;

    let replies = env.replies_to(&event.message_id).await;
    assert_eq!(replies.len(), 1, "exactly one reply document");
    let reply = &replies[0];
    let reply_id = reply.get_object_id("_id").expect("_id is an ObjectId");
    assert_eq!(
        reply.get("conversationId"),
        Some(&Bson::ObjectId(oid(JESS_KAORI)))
    );
    assert_eq!(
        reply.get_str("senderId").unwrap(),
        KAORI,
        "senderId is the bot's id as a string, as the seeds show"
    );
    assert_eq!(
        reply.get_str("content").unwrap(),
        "omg yes!! send me a clip 🔥"
    );
    assert_eq!(reply.get("richContent"), Some(&Bson::Null));
    assert!(matches!(reply.get("timestamp"), Some(Bson::DateTime(_))));
    assert!(!reply.get_bool("read").unwrap(), "read is false");
    assert_eq!(
        reply.get("inReplyTo"),
        Some(&Bson::ObjectId(oid(&event.message_id)))
    );

    assert_eq!(completion.message_id, reply_id.to_hex());
    assert_eq!(completion.in_reply_to, Some(event.message_id.clone()));
    assert_eq!(completion.conversation_id, JESS_KAORI);
    assert_eq!(completion.sender_id, KAORI);
    assert_eq!(completion.content, "omg yes!! send me a clip 🔥");
    assert_eq!(completion.rich_content, None);
    assert_eq!(
        completion.created_at.timestamp_millis(),
        reply.get_datetime("timestamp").unwrap().timestamp_millis()
    );

    let rows = sqlx::query("SELECT role, content, message_id, conversation_id FROM bot_conversations WHERE user_id = $1 AND bot_id = $2 ORDER BY created_at, id")
        .bind(JESS)
        .bind(KAORI)
        .fetch_all(&env.pg.pool)
        .await
        .unwrap();
    let rows: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| (r.get("role"), r.get("content"), r.get("message_id")))
        .collect();
    assert_eq!(
        rows,
        vec![
            (
                "user".into(),
                "just landed my first kickflip!!".into(),
                event.message_id.clone()
            ),
            (
                "assistant".into(),
                "omg yes!! send me a clip 🔥".into(),
                reply_id.to_hex()
            ),
        ]
    );

    let typing = tokio::time::timeout(Duration::from_secs(5), typing.next())
        .await
        .unwrap()
        .unwrap();
    let typing: Value = serde_json::from_slice(&typing.payload).unwrap();
    assert_eq!(typing["conversationId"], JESS_KAORI);
    assert_eq!(typing["senderId"], KAORI);
    assert_eq!(typing["typing"], true);

    let conv = env
        .mongo
        .collection("dm_conversations")
        .find_one(doc! {"_id": oid(JESS_KAORI)})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        conv.get_str("lastMessage").unwrap(),
        "omg yes!! send me a clip 🔥"
    );
    env.finish().await;
}

#[tokio::test]
async fn the_model_gets_the_character_the_tricklists_and_the_last_messages_in_order() {
    // A window that slides a message a turn (the anchored one, the default, begins at an anchor
    // among these: `prompt_budget::a_conversations_turns_share_their_history…`).
    let env = TestEnv::with(
        always(StubReply::text("ok wait what level are you at rn??")),
        |c| c.prompt.history_step = 1,
    )
    .await;
    // 25 earlier messages; only the last `COMPANION_HISTORY_LIMIT` may be sent, oldest first.
    let limit = env.config.turn.history_limit as usize;
    assert!(limit < 25, "the default window leaves some out");
    env.earlier_messages(25, |i| format!("history message {i}"))
        .await;
    env.spawn_app().await;
    let event = env
        .dm(JESS, KAORI, JESS_KAORI, "what should i learn next?")
        .await;
    env.turn(&event).await;

    let requests = env.stub.requests();
    assert_eq!(requests.len(), 1);
    let messages = requests[0]["messages"].as_array().unwrap();
    assert_eq!(
        messages.len(),
        limit + 3,
        "system + {limit} history + this turn's context + the new message"
    );
    let system = messages[0]["content"].as_str().unwrap();
    assert_eq!(messages[0]["role"], "system");
    assert!(
        system.starts_with("You are Kaori"),
        "character name: {system}"
    );
    assert!(
        system.contains("Japanese snowboarder from SSX Tricky"),
        "character bio"
    );
    assert!(system.contains("Gen Z texting energy"), "style rules");
    assert!(system.contains("mac fraser obviously"), "message examples");
    assert!(system.contains("Jess Rivera"), "user profile");
    assert!(
        system.contains("Park Essentials") && system.contains("Winter Goals"),
        "the user's tricklists"
    );
    assert!(
        system.contains("Kickflip") && !system.contains("Kickflip ✓") && system.contains("Ollie ✓"),
        "trick names and checked state resolved"
    );
    assert!(
        !system.contains("Sam's Secret List"),
        "never another user's lists"
    );
    for (i, m) in messages[1..=limit].iter().enumerate() {
        let n = i + 25 - limit;
        assert_eq!(m["content"], format!("history message {n}"));
        assert_eq!(
            m["role"],
            if n.is_multiple_of(2) {
                "user"
            } else {
                "assistant"
            }
        );
    }
    assert_eq!(messages[limit + 1]["role"], "system");
    assert!(
        messages[limit + 1]["content"]
            .as_str()
            .unwrap()
            .contains("Now: "),
        "the time goes after the history, where it does not break a cached prefix"
    );
    assert_eq!(messages[limit + 2]["role"], "user");
    assert_eq!(messages[limit + 2]["content"], "what should i learn next?");
    assert_eq!(requests[0]["model"], env.config.llm.model);
    env.finish().await;
}

#[tokio::test]
async fn malformed_events_are_dead_lettered_and_the_next_good_event_is_answered() {
    let env = TestEnv::new(always(StubReply::text("yo"))).await;
    env.spawn_app().await;
    let subject = env.bus.names.inbound(KAORI, JESS_KAORI);
    env.publish_raw(subject.clone(), "bad-1", "this is not json")
        .await;
    env.publish_raw(
        subject.clone(),
        "bad-2",
        r#"{"messageId": 5, "content": []}"#,
    )
    .await;
    env.publish_raw(subject.clone(), "bad-3", vec![0xff, 0xfe, 0x00])
        .await;
    let mut ghost = env.dm(JESS, KAORI, JESS_KAORI, "hello?").await;
    ghost.bot_id = "65f00000000000000000dead".into();
    env.publish(&ghost).await; // unknown bot
    let mut lost = env.dm(JESS, KAORI, JESS_KAORI, "anyone there?").await;
    lost.conversation_id = "65f00000000000000000beef".into();
    env.publish(&lost).await; // no such conversation
    let mut intruder = env.dm(SAM, KAORI, JESS_KAORI, "let me in").await;
    intruder.sender_id = SAM.into();
    env.publish(&intruder).await; // not a participant

    let good = env.dm(JESS, KAORI, JESS_KAORI, "ok for real now").await;
    let reply = env.turn(&good).await;
    assert_eq!(reply.content, "yo");

    let settled = eventually(Duration::from_secs(10), || async {
        env.dead_letters().await.len() >= 6
    })
    .await;
    let dead = env.dead_letters().await;
    assert!(settled, "six dead letters, got {dead:?}");
    let reasons: Vec<&str> = dead.iter().map(|(r, _)| r.as_str()).collect();
    // One conversation's events are settled in publish order; other subjects run beside them.
    let same: Vec<&str> = dead
        .iter()
        .filter(|(r, _)| !r.contains("does not exist") && !r.contains("no character"))
        .map(|(r, _)| r.as_str())
        .collect();
    assert_eq!(same.len(), 4, "{reasons:?}");
    assert!(same[0].contains("not valid JSON"), "{reasons:?}");
    assert!(same[1].contains("not valid JSON"), "{reasons:?}");
    assert!(same[2].contains("not UTF-8"), "{reasons:?}");
    assert!(same[3].contains("not a participant"), "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r.contains("no character for bot")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("does not exist")),
        "{reasons:?}"
    );
    let first_of_conversation = dead
        .iter()
        .find(|(r, _)| r.contains("not valid JSON"))
        .expect("a JSON dead letter");
    assert_eq!(
        &first_of_conversation.1[..],
        b"this is not json",
        "the original bytes are kept for replay"
    );
    assert_eq!(
        env.stub.requests().len(),
        1,
        "only the good event reached the model"
    );
    for e in [&ghost, &lost, &intruder] {
        assert!(
            env.replies_to(&e.message_id).await.is_empty(),
            "no reply to a rejected event"
        );
    }
    env.finish().await;
}

#[tokio::test]
async fn a_duplicate_publish_is_answered_once() {
    let env = TestEnv::new(always(StubReply::text("got it"))).await;
    env.spawn_app().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "double tap").await;
    let mut replies = env.completions(JESS_KAORI).await;
    assert!(!env.publish(&event).await, "first publish is new");
    assert!(
        env.publish(&event).await,
        "second publish with the same Nats-Msg-Id is a duplicate"
    );
    next_reply_to(&mut replies, &event.message_id, Duration::from_secs(30)).await;
    // Nothing more arrives for it, once everything published is settled.
    env.drained(Drained::Inbound).await;
    let extra = reply_within(&mut replies, &event.message_id, Duration::from_millis(200)).await;
    assert!(extra.is_none(), "a second completion arrived: {extra:?}");
    assert_eq!(env.replies_to(&event.message_id).await.len(), 1);
    assert_eq!(env.stub.requests().len(), 1);
    env.finish().await;
}

#[tokio::test]
async fn running_a_turn_again_writes_nothing_twice() {
    let env = TestEnv::new(always(StubReply::text("first answer"))).await;
    let svc = env.spawn_app().await;
    let raw = env.dm(JESS, KAORI, JESS_KAORI, "once only").await;
    let event = dm_event(&raw);
    let first = svc.pipeline.process_dm(&event).await.unwrap();
    let second = svc.pipeline.process_dm(&event).await.unwrap();
    assert!(matches!(first, pipeline::Outcome::Answered { .. }));
    assert_eq!(
        second,
        pipeline::Outcome::AlreadySettled { state: State::Done }
    );
    assert_eq!(env.replies_to(&raw.message_id).await.len(), 1);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM bot_conversations")
        .fetch_one(&env.pg.pool)
        .await
        .unwrap();
    assert_eq!(n, 2);
    assert_eq!(env.stub.requests().len(), 1, "the model was asked once");
    env.finish().await;
}

#[tokio::test]
async fn a_recorded_reply_is_delivered_without_asking_the_model_again() {
    let env = TestEnv::new(always(StubReply::text("a different answer"))).await;
    let svc = env.spawn_app().await;
    let raw = env
        .dm(JESS, KAORI, JESS_KAORI, "crash after the model answered")
        .await;
    // A previous attempt got its answer recorded, then died before writing it.
    let job = env
        .journal()
        .open(&NewJob {
            id: &raw.message_id,
            kind: "turn",
            user: JESS,
            bot: KAORI,
            conversation: JESS_KAORI,
            stream_seq: None,
            reads: Default::default(),
        })
        .await
        .unwrap();
    let reply_id = bson::oid::ObjectId::new().to_hex();
    // As the journal holds it (a record reads back whatever fields later versions added).
    let fixed: pipeline::Reply = serde_json::from_value(serde_json::json!({
        "id": reply_id.clone(),
        "content": "the recorded answer",
        "richContent": null,
        "at": chrono::Utc::now(),
        "toolLog": null,
    }))
    .unwrap();
    job.step(&companion::testing::steps::REPLY, "g0")
        .run(async { Ok::<_, companion_journal::JournalError>(fixed) })
        .await
        .unwrap();
    let event = dm_event(&raw);
    let outcome = svc.pipeline.process_dm(&event).await.unwrap();
    assert_eq!(
        outcome,
        pipeline::Outcome::Answered {
            reply_id: reply_id.clone()
        }
    );
    let replies = env.replies_to(&raw.message_id).await;
    assert_eq!(replies.len(), 1);
    assert_eq!(
        replies[0].get_str("content").unwrap(),
        "the recorded answer"
    );
    assert_eq!(replies[0].get_object_id("_id").unwrap().to_hex(), reply_id);
    assert!(env.stub.requests().is_empty(), "no paid call repeated");
    env.finish().await;
}

#[tokio::test]
async fn a_failing_turn_is_redelivered_and_answered_once() {
    let responder = scripted(
        vec![StubReply::Status {
            code: 500,
            body: "upstream exploded".into(),
            retry_after: None,
        }],
        StubReply::text("back online!"),
    );
    // No retries inside the turn: this exercises the NAK and redelivery path.
    let env = TestEnv::with(responder, |c| c.llm.max_retries = 0).await;
    env.spawn_app().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "you there?").await;
    let reply = env.turn(&event).await;
    assert_eq!(reply.content, "back online!");
    assert_eq!(env.stub.requests().len(), 2);
    assert_eq!(env.replies_to(&event.message_id).await.len(), 1);
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM jobs WHERE id = $1")
        .bind(&event.message_id)
        .fetch_one(&env.pg.pool)
        .await
        .unwrap();
    assert_eq!(attempts, 2);
    env.finish().await;
}

#[tokio::test]
async fn a_request_the_model_refuses_gets_the_honest_failure_line_once_and_a_dead_letter() {
    let responder = always(StubReply::Status {
        code: 400,
        body: "{\"error\":{\"message\":\"bad request\"}}".into(),
        retry_after: None,
    });
    let env = TestEnv::new(responder).await;
    env.spawn_app().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "this will not work").await;
    let reply = env.turn(&event).await;
    assert_eq!(reply.content, failure_line("kaori"));
    assert!(
        eventually(Duration::from_secs(10), || async {
            env.dead_letters().await.len() == 1
        })
        .await
    );
    assert!(
        env.dead_letters().await[0]
            .0
            .contains("rejected the request")
    );
    assert_eq!(env.replies_to(&event.message_id).await.len(), 1);
    let state: String = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1")
        .bind(&event.message_id)
        .fetch_one(&env.pg.pool)
        .await
        .unwrap();
    assert_eq!(state, "failed");
    env.finish().await;
}

#[tokio::test]
async fn an_attempt_that_hangs_past_the_turn_deadline_is_retried_and_answered_once() {
    // The model accepts the first request and does not answer for a minute (its own timeout is longer):
    // only the turn's deadline ends that attempt.
    let hang = StubReply::Delayed(
        Duration::from_secs(60),
        Box::new(StubReply::text("too late")),
    );
    let env = TestEnv::with(scripted(vec![hang], StubReply::text("finally")), |c| {
        c.turn.turn_timeout_secs = 2;
        c.llm.timeout_secs = 120;
        c.llm.max_retries = 0;
        c.worker.retry_delay_secs = 1;
    })
    .await;
    env.spawn_app().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "still there?").await;
    let mut replies = env.completions(JESS_KAORI).await;
    let started = std::time::Instant::now();
    env.publish(&event).await;
    let reply = next_reply_to(&mut replies, &event.message_id, Duration::from_secs(20)).await;
    assert_eq!(reply.content, "finally");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the first attempt waited for its deadline"
    );
    assert_eq!(env.stub.requests().len(), 2, "asked once per attempt");
    assert_eq!(env.replies_to(&event.message_id).await.len(), 1);
    let job = env
        .journal()
        .get(&event.message_id)
        .await
        .unwrap()
        .expect("the job");
    assert_eq!(job.attempts, 2);
    assert!(
        job.last_error
            .as_deref()
            .is_some_and(|e| e.contains("longer than 2 s")),
        "{:?}",
        job.last_error
    );
    env.finish().await;
}
