//! Dead letters and replay: a poison event uses up its deliveries, is dead-lettered and answered with
//! the honest failure line once, without holding up other conversations; once the cause is fixed,
//! `companion replay --dlq` answers it (a new reply generation), and a second replay changes nothing.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use crate::env::*;
use bson::doc;
use companion_dev::stub::{Responder, StubReply};
use futures::StreamExt;
use serde_json::Value;

/// Answers `re: <last user text>`, except that while `broken` is set a message containing "POISON"
/// gets a 500 every time.
fn poison_model(broken: Arc<AtomicBool>) -> Responder {
    Arc::new(move |body: &Value| {
        let text = last_message(body)["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if text.contains("POISON") && broken.load(Ordering::SeqCst) {
            return StubReply::Status {
                code: 500,
                body: "upstream exploded".into(),
                retry_after: None,
            };
        }
        StubReply::text(format!("re: {text}"))
    })
}

#[tokio::test]
async fn a_poison_event_is_dead_lettered_and_replay_answers_it_once_fixed() {
    let broken = Arc::new(AtomicBool::new(true));
    let env = TestEnv::with(poison_model(broken.clone()), |c| {
        c.consumer.max_deliver = 3;
        c.worker.retry_delay_secs = 1;
        c.llm.max_retries = 0;
    })
    .await;
    env.spawn_app().await;
    let tony = env.conversation(JESS, TONY).await;
    let mut all = env.all_completions().await;

    let poison = env.dm(JESS, KAORI, JESS_KAORI, "POISON pill").await;
    env.publish(&poison).await;
    // Another conversation is answered while the poison event is retried.
    let other = env.dm(JESS, TONY, &tony, "unrelated question").await;
    env.publish(&other).await;
    // A message after the poison one in its own conversation, once the poison turn has fixed its
    // burst: it waits for the poison event to settle, then gets its own answer.
    let first_try = eventually(Duration::from_secs(20), || async {
        env.stub
            .requests()
            .iter()
            .any(|r| last_message(r)["content"] == "POISON pill")
    })
    .await;
    assert!(first_try, "the poison event reached the model");
    let after = env.dm(JESS, KAORI, JESS_KAORI, "are you there?").await;
    env.publish(&after).await;

    let mut got = Vec::new();
    let done = tokio::time::timeout(Duration::from_secs(40), async {
        while got.len() < 3 {
            got.push(all.next().await.expect("completions"));
        }
    })
    .await;
    assert!(done.is_ok(), "three completions, got {got:?}");
    let by = |id: &str| {
        got.iter()
            .position(|c| c.in_reply_to.as_deref() == Some(id))
    };
    let (p, o, a) = (
        by(&poison.message_id).expect("poison answered"),
        by(&other.message_id).expect("other answered"),
        by(&after.message_id).expect("follower answered"),
    );
    assert_eq!(
        got[p].content,
        failure_line("kaori"),
        "the honest failure line"
    );
    assert_eq!(got[o].content, "re: unrelated question");
    assert_eq!(got[a].content, "re: are you there?");
    assert!(
        o < p,
        "the other conversation did not wait for the poison event"
    );
    assert!(p < a, "the poison event's conversation kept its order");

    let dead = env.dead_letters().await;
    assert_eq!(dead.len(), 1, "one dead letter: {dead:?}");
    assert!(dead[0].0.contains("500"), "reason says why: {}", dead[0].0);
    let poison_requests = env
        .stub
        .requests()
        .iter()
        .filter(|r| last_message(r)["content"] == "POISON pill")
        .count();
    assert_eq!(
        poison_requests, 3,
        "one model call per delivery, three deliveries"
    );

    // Still broken: the replay fails, says why, and sends nothing.
    let (ok, out, _) = env.run_companion(&["replay", "--dlq"]).await;
    assert!(!ok, "a failed replay exits non-zero:\n{out}");
    assert!(out.contains("1 failed"), "{out}");
    assert_eq!(env.replies_to(&poison.message_id).await.len(), 1);

    // Fixed: a dry run lists it, the replay answers it with a second reply.
    broken.store(false, Ordering::SeqCst);
    let (ok, out, _) = env.run_companion(&["replay", "--dlq", "--dry-run"]).await;
    assert!(ok, "{out}");
    assert!(out.contains("would run (failed earlier"), "{out}");
    assert_eq!(
        env.replies_to(&poison.message_id).await.len(),
        1,
        "a dry run changes nothing"
    );

    let mut poison_replies = env.completions(JESS_KAORI).await;
    let (ok, out, err) = env.run_companion(&["replay", "--dlq"]).await;
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("1 done"), "{out}");
    assert!(
        err.contains("[##############################] 1/1"),
        "progress bar: {err}"
    );
    let answer = next_reply_to(
        &mut poison_replies,
        &poison.message_id,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(answer.content, "re: POISON pill");
    let replies = env.replies_to(&poison.message_id).await;
    assert_eq!(replies.len(), 2, "the failure line, then the real answer");
    let answer_doc = replies
        .iter()
        .find(|r| r.get_i32("replyGeneration").ok() == Some(1))
        .expect("the answer is generation 1");
    assert_eq!(answer_doc.get_str("content").unwrap(), "re: POISON pill");

    // Nothing twice: a second replay skips it.
    let (ok, out, _) = env.run_companion(&["replay", "--dlq"]).await;
    assert!(ok, "{out}");
    assert!(out.contains("0 done, 1 skipped"), "{out}");
    assert_eq!(env.replies_to(&poison.message_id).await.len(), 2);

    // The inbound stream by conversation: everything answered is skipped, unless forced.
    let (ok, out, _) = env
        .run_companion(&["replay", "--conversation", JESS_KAORI])
        .await;
    assert!(ok, "{out}");
    assert!(out.contains("2 selected, 0 done, 2 skipped"), "{out}");
    let (ok, out, _) = env
        .run_companion(&["replay", "--conversation", JESS_KAORI, "--force"])
        .await;
    assert!(ok, "{out}");
    assert!(out.contains("2 done"), "{out}");
    let count = env
        .mongo
        .collection("dm_messages")
        .count_documents(doc! { "inReplyTo": companion_store::bus::event::parse_object_id(&after.message_id).unwrap() })
        .await
        .unwrap();
    assert_eq!(count, 2, "a forced replay answers again, once");
    env.finish().await;
}
