//! Per-conversation order and bursts: one conversation's messages are handled one at a time in publish
//! order, across worker processes; messages already waiting when a turn starts are answered by that
//! turn's reply (listed in its `covers`), never twice and never lost.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use crate::env::*;
use bson::doc;
use companion_dev::stub::{Responder, StubReply};
use companion_store::bus::event::Completion;
use futures::StreamExt;
use serde_json::Value;

/// The user texts a request carries (history and new messages), in order.
fn user_texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["role"] == "user")
                .filter_map(|m| m["content"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Answers with the user texts that follow the last assistant message, after a short random delay.
fn echo_model(max_delay_ms: u64) -> Responder {
    Arc::new(move |body: &Value| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let start = messages
            .iter()
            .rposition(|m| m["role"] == "assistant")
            .map(|i| i + 1)
            .unwrap_or(0);
        let new: Vec<String> = messages[start..]
            .iter()
            .filter(|m| m["role"] == "user")
            .filter_map(|m| m["content"].as_str().map(str::to_owned))
            .collect();
        StubReply::Delayed(
            Duration::from_millis(fastrand::u64(5..=max_delay_ms.max(5))),
            Box::new(StubReply::text(format!("got {}", new.join(" | ")))),
        )
    })
}

#[tokio::test]
async fn a_burst_waiting_in_the_stream_is_answered_by_one_reply_in_order() {
    let env = TestEnv::new(echo_model(5)).await;
    let texts = [
        "hey",
        "so i landed my first kickflip",
        "like actually",
        "what next?",
    ];
    let mut events = Vec::new();
    for t in texts {
        let e = env.dm(JESS, KAORI, JESS_KAORI, t).await;
        env.publish(&e).await;
        events.push(e);
    }
    let mut replies = env.completions(JESS_KAORI).await;
    env.spawn_app().await;
    let reply = next_reply_to(&mut replies, &events[0].message_id, Duration::from_secs(30)).await;
    assert_eq!(
        reply.covers,
        events[1..]
            .iter()
            .map(|e| e.message_id.clone())
            .collect::<Vec<_>>(),
        "the later messages are covered by the first one's reply"
    );
    assert_eq!(reply.content, format!("got {}", texts.join(" | ")));
    let requests = env.stub.requests();
    assert_eq!(requests.len(), 1, "one model call for the burst");
    let sent = user_texts(&requests[0]);
    assert_eq!(
        &sent[sent.len() - 4..],
        texts,
        "the model saw all four, in order"
    );

    for e in &events[1..] {
        assert!(
            env.replies_to(&e.message_id).await.is_empty(),
            "no reply of its own"
        );
        let (state, by): (String, Option<String>) =
            sqlx::query_as("SELECT state, covered_by FROM jobs WHERE id = $1")
                .bind(&e.message_id)
                .fetch_one(&env.pg.pool)
                .await
                .unwrap();
        assert_eq!(state, "covered");
        assert_eq!(by.as_deref(), Some(events[0].message_id.as_str()));
    }
    // History keeps every message, in order, then the one reply.
    let history: Vec<(String, String)> =
        sqlx::query_as("SELECT role, content FROM bot_conversations ORDER BY created_at, id")
            .fetch_all(&env.pg.pool)
            .await
            .unwrap();
    let contents: Vec<&str> = history.iter().map(|(_, c)| c.as_str()).collect();
    assert_eq!(&contents[..4], texts);
    assert_eq!(history[4].0, "assistant");

    // The next message is a turn of its own that sees the whole burst and its answer.
    let next = env.dm(JESS, KAORI, JESS_KAORI, "thanks!").await;
    let second = env.turn(&next).await;
    assert!(second.covers.is_empty());
    assert_eq!(second.content, "got thanks!");
    let requests = env.stub.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        user_texts(&requests[1])[..5],
        [
            "hey",
            "so i landed my first kickflip",
            "like actually",
            "what next?",
            "thanks!"
        ]
    );
    env.finish().await;
}

#[tokio::test]
async fn three_workers_fifty_conversations_bursts_of_five_keep_order_and_answer_each_once() {
    const CONVERSATIONS: usize = 50;
    const BURST: usize = 5;
    let env = TestEnv::with(echo_model(120), |c| {
        c.worker.concurrency = 8;
        c.consumer.ack_wait_secs = 10;
    })
    .await;
    // Fifty users, each in a conversation with Kaori.
    let conversations = env.new_conversations(KAORI, CONVERSATIONS).await;
    let mut workers: Vec<_> = (0..3).map(|_| env.spawn_app_process(&[])).collect();
    let mut completions = env.all_completions().await;

    // Bursts: five messages per conversation, interleaved across conversations, as fast as possible.
    let mut published: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for i in 0..BURST {
        for (n, (user, conversation)) in conversations.iter().enumerate() {
            let text = format!("c{n} m{i}");
            let e = env.dm(user, KAORI, conversation, &text).await;
            env.publish(&e).await;
            published
                .entry(conversation.clone())
                .or_default()
                .push((e.message_id.clone(), text));
        }
    }
    let total = CONVERSATIONS * BURST;

    // Collect completions until every message is answered or covered.
    let mut answered: HashMap<String, usize> = HashMap::new();
    let mut got: Vec<Completion> = Vec::new();
    let finished = tokio::time::timeout(Duration::from_secs(120), async {
        while answered.len() < total {
            let c = completions.next().await.expect("completions");
            for id in c.in_reply_to.iter().chain(&c.covers) {
                *answered.entry(id.clone()).or_default() += 1;
            }
            got.push(c);
        }
    })
    .await;
    assert!(
        finished.is_ok(),
        "only {} of {total} messages answered or covered",
        answered.len()
    );
    // Every delivery settled (a duplicate reply would have been published before its ack), then what
    // is left on the subscription.
    env.drained(Drained::Inbound).await;
    while let Ok(Some(c)) =
        tokio::time::timeout(Duration::from_millis(200), completions.next()).await
    {
        for id in c.in_reply_to.iter().chain(&c.covers) {
            *answered.entry(id.clone()).or_default() += 1;
        }
        got.push(c);
    }
    let twice: Vec<_> = answered.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "answered more than once: {twice:?}");
    let all_ids: HashSet<&String> = published.values().flatten().map(|(id, _)| id).collect();
    assert_eq!(answered.len(), total);
    assert!(answered.keys().all(|id| all_ids.contains(id)));

    // Per conversation: replies in order, each burst a contiguous run starting at its head.
    let mut by_conversation: BTreeMap<&str, Vec<&Completion>> = BTreeMap::new();
    for c in &got {
        by_conversation
            .entry(c.conversation_id.as_str())
            .or_default()
            .push(c);
    }
    for (conversation, messages) in &published {
        let replies = by_conversation
            .get(conversation.as_str())
            .unwrap_or_else(|| panic!("no reply in {conversation}"));
        let covered_in_order: Vec<&String> = replies
            .iter()
            .flat_map(|c| c.in_reply_to.iter().chain(&c.covers))
            .collect();
        let expected: Vec<&String> = messages.iter().map(|(id, _)| id).collect();
        assert_eq!(covered_in_order, expected, "order kept in {conversation}");
        // One reply document per completion, none lost.
        let docs = env
            .mongo
            .collection("dm_messages")
            .count_documents(
                doc! { "conversationId": oid(conversation), "inReplyTo": { "$exists": true } },
            )
            .await
            .unwrap();
        assert_eq!(
            docs as usize,
            replies.len(),
            "reply documents in {conversation}"
        );
    }

    // Every model call of a conversation saw exactly the messages published before, in order, and the
    // replies of all earlier turns: no two turns of a conversation overlapped.
    let mut calls: HashMap<String, Vec<Vec<String>>> = HashMap::new();
    for r in env.stub.requests() {
        let texts = user_texts(&r);
        let Some(first) = texts.first() else { continue };
        let conversation = first.split(' ').next().unwrap_or_default().to_owned();
        let assistants = r["messages"]
            .as_array()
            .map(|m| m.iter().filter(|m| m["role"] == "assistant").count())
            .unwrap_or(0);
        let calls = calls.entry(conversation.clone()).or_default();
        assert_eq!(
            assistants,
            calls.len(),
            "{conversation}: a turn ran before the previous one ended"
        );
        calls.push(texts);
    }
    for (n, (_, conversation)) in conversations.iter().enumerate() {
        let texts: Vec<String> = published[conversation]
            .iter()
            .map(|(_, t)| t.clone())
            .collect();
        let seen = &calls[&format!("c{n}")];
        let mut last = 0;
        for s in seen {
            assert_eq!(
                s[..],
                texts[..s.len()],
                "c{n}: the model saw the messages in publish order"
            );
            assert!(s.len() > last, "c{n}: every turn brought new messages");
            last = s.len();
        }
        assert_eq!(last, BURST, "c{n}: the last turn saw all five");
    }
    eprintln!(
        "{total} messages answered by {} replies ({} model calls)",
        got.len(),
        env.stub.requests().len()
    );
    for w in &mut workers {
        stop(w);
    }
    env.finish().await;
}

#[tokio::test]
async fn a_turn_moves_its_conversation_s_floor_with_its_own_settlement() {
    let env = TestEnv::new(echo_model(5)).await;
    env.spawn_app().await;
    let first = env.dm(JESS, KAORI, JESS_KAORI, "first").await;
    env.turn(&first).await;
    env.settled(&first.message_id).await;
    let second = env.dm(JESS, KAORI, JESS_KAORI, "second").await;
    env.turn(&second).await;
    let job = env.settled(&second.message_id).await;
    // Acknowledged, so the worker's settlement is over: its own upsert, had it run after the job's
    // settling statement, would have moved `updated_at` on from that statement's transaction time.
    env.drained(Drained::Inbound).await;
    let (next, together): (i64, bool) = sqlx::query_as(
        "SELECT f.next_seq, f.updated_at = j.updated_at FROM order_floors f, jobs j WHERE j.id = $1",
    )
    .bind(&second.message_id)
    .fetch_one(&env.pg.pool)
    .await
    .unwrap();
    let seq = job.stream_seq.expect("the job knows its stream sequence") as i64;
    assert_eq!(next, seq + 1, "the floor is past the second message");
    assert!(together, "the floor moved in the job's settlement");
    env.finish().await;
}
