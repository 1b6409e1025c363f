//! The per-user flood limit: a user sending faster than the limit costs no model call over it; the
//! first limited message gets the character's busy line, the rest of the window none, and every message
//! is recorded and acknowledged (none silently dropped, none left in the stream).

use std::{sync::Arc, time::Duration};

use crate::env::*;
use companion_dev::stub::{Responder, StubReply, last_user_text};
use serde_json::Value;

pub(crate) fn busy_line(slug: &str) -> String {
    character_line(slug, "busyLine")
}

#[tokio::test]
async fn a_flood_is_limited_answered_once_and_nothing_is_dropped() {
    let echo: Responder =
        Arc::new(|body: &Value| StubReply::text(format!("ok: {}", last_user_text(body))));
    let env = TestEnv::with(echo, |c| {
        c.turn.user_turns_per_minute = 2;
        // Every message its own turn, so the limit is what stops them.
        c.turn.burst_max = 0;
    })
    .await;
    env.spawn_app().await;
    let mut replies = env.completions(JESS_KAORI).await;
    let mut events = Vec::new();
    for i in 0..6 {
        let e = env.dm(JESS, KAORI, JESS_KAORI, &format!("spam {i}")).await;
        env.publish(&e).await;
        events.push(e);
    }
    let mut got = Vec::new();
    for e in &events[..3] {
        got.push(next_reply_to(&mut replies, &e.message_id, Duration::from_secs(30)).await);
    }
    assert_eq!(got[0].content, "ok: spam 0");
    assert_eq!(got[1].content, "ok: spam 1");
    assert_eq!(
        got[2].content,
        busy_line("kaori"),
        "the first limited message gets the busy line"
    );

    // The rest settle as limited, answered by that busy line, without a reply of their own.
    let settled = eventually(Duration::from_secs(20), || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'limited'")
            .fetch_one(&env.pg.pool)
            .await
            .unwrap();
        n == 4
    })
    .await;
    assert!(settled, "four limited turns");
    for e in &events[3..] {
        let by: Option<String> = sqlx::query_scalar("SELECT covered_by FROM jobs WHERE id = $1")
            .bind(&e.message_id)
            .fetch_one(&env.pg.pool)
            .await
            .unwrap();
        assert_eq!(by.as_deref(), Some(events[2].message_id.as_str()));
        assert!(env.replies_to(&e.message_id).await.is_empty());
    }
    assert_eq!(env.stub.requests().len(), 2, "no model call over the limit");
    // Every message is in the history the next turn sees.
    let users: i64 =
        sqlx::query_scalar("SELECT count(*) FROM bot_conversations WHERE role = 'user'")
            .fetch_one(&env.pg.pool)
            .await
            .unwrap();
    assert_eq!(users, 6);
    // And every event left the stream acknowledged.
    let acked = eventually(Duration::from_secs(10), || async {
        env.consumer_info()
            .await
            .is_some_and(|info| info.num_ack_pending == 0 && info.num_pending == 0)
    })
    .await;
    assert!(acked, "nothing left pending");
    assert!(
        env.replies_to(&events[0].message_id).await.len() == 1
            && env.dead_letters().await.is_empty(),
        "limited is not a failure"
    );
    env.finish().await;
}

/// The pipeline's incoming hook sees every user message: the head of a burst and the messages it
/// covers, a turn over the flood limit (busy line), one limited without a reply of its own, and a group
/// message nobody answers; none of them is skipped by the limit, the burst or the routing.
#[tokio::test]
async fn every_user_message_passes_the_incoming_hook_whatever_becomes_of_it() {
    let echo: Responder =
        Arc::new(|body: &Value| StubReply::text(format!("ok: {}", last_user_text(body))));
    let env = TestEnv::with(echo, |c| c.turn.user_turns_per_minute = 2).await;
    let dm = |text: &'static str| env.dm(JESS, KAORI, JESS_KAORI, text);
    let mut replies = env.completions(JESS_KAORI).await;

    // A burst of three in the stream before a worker runs: one turn, two covered.
    let burst = [dm("hey").await, dm("so").await, dm("quick q").await];
    for e in &burst {
        env.publish(e).await;
    }
    let worker = env.spawn_app().await;
    let answer = next_reply_to(&mut replies, &burst[0].message_id, Duration::from_secs(30)).await;
    assert_eq!(answer.covers.len(), 2, "one reply for the burst");

    // The second turn of the minute; the third says the busy line; the fourth gets nothing.
    for (text, expect_reply) in [("one more", true), ("and more", true), ("and more!", false)] {
        let e = dm(text).await;
        env.publish(&e).await;
        if expect_reply {
            next_reply_to(&mut replies, &e.message_id, Duration::from_secs(30)).await;
        } else {
            let journal = env.journal();
            let limited = eventually(Duration::from_secs(20), || async {
                journal
                    .get(&e.message_id)
                    .await
                    .unwrap()
                    .is_some_and(|j| j.state == companion_journal::State::Limited)
            })
            .await;
            assert!(limited, "limited without a reply");
        }
    }

    // A group message that is only an acknowledgement: routed to nobody.
    let group =
        companion_dev::backend::create_group(&env.mongo, &[oid(JESS)], &[oid(KAORI), oid(TONY)])
            .await
            .unwrap();
    let ack = companion_dev::backend::store_group_message(&env.mongo, group, oid(JESS), "lol")
        .await
        .unwrap();
    companion_dev::backend::publish_group_message(&env.bus, &ack)
        .await
        .unwrap();
    let journal = env.journal();
    let dropped = eventually(Duration::from_secs(20), || async {
        journal
            .get(&ack.message_id)
            .await
            .unwrap()
            .is_some_and(|j| j.state == companion_journal::State::Dropped)
    })
    .await;
    assert!(dropped, "nobody answers an acknowledgement");

    let seen = |kind: &'static str| {
        let worker = &worker;
        async move {
            let series = format!("companion_user_messages_total{{kind=\"{kind}\"}}");
            worker.metric(&series).await
        }
    };
    assert_eq!(
        seen("dm").await,
        Some(6.0),
        "3 of the burst, 2 answered, 1 limited"
    );
    assert_eq!(seen("group").await, Some(1.0));
    worker.stop().await;
    env.finish().await;
}
