//! Hostile input: tens of thousands of generated malformed events never panic the parser, and a worker
//! fed thousands of them, on one conversation's subject and on made-up ones, dead-letters each once with
//! a reason and keeps answering good events.

use std::time::Duration;

use crate::env::*;
use companion_dev::stub::{StubReply, always};
use companion_store::bus::event::{EventLimits, InvalidEvent, parse_inbound};
use serde_json::{Value, json};

const LIMITS: EventLimits = EventLimits {
    max_event_bytes: 64 * 1024,
    max_content_chars: 4000,
};

fn good_event(rng: &mut fastrand::Rng) -> Value {
    json!({
        "messageId": format!("{:024x}", rng.u128(..) & ((1u128 << 96) - 1)),
        "conversationId": JESS_KAORI,
        "senderId": JESS,
        "botId": KAORI,
        "content": "how do i ollie higher?",
        "sentAt": "2026-11-22T10:00:00Z",
    })
}

fn random_value(rng: &mut fastrand::Rng, depth: u32) -> Value {
    match rng.u8(..8) {
        0 => Value::Null,
        1 => Value::Bool(rng.bool()),
        2 => json!(rng.i64(..)),
        3 => json!(rng.f64() * 1e6),
        4 => Value::String((0..rng.usize(..40)).map(|_| rng.char(..)).collect()),
        5 if depth < 3 => Value::Array(
            (0..rng.usize(..4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        6 if depth < 3 => Value::Object(
            (0..rng.usize(..4))
                .map(|i| (format!("k{i}"), random_value(rng, depth + 1)))
                .collect(),
        ),
        _ => Value::String(format!("{:024x}", rng.u128(..) & ((1u128 << 96) - 1))),
    }
}

/// A good event with one hostile mutation; `None` when the mutation happens to leave it valid.
fn mutate(rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut v = good_event(rng);
    let fields = [
        "messageId",
        "conversationId",
        "senderId",
        "botId",
        "content",
        "sentAt",
        "attachments",
    ];
    match rng.u8(..9) {
        0 => {
            v[fields[rng.usize(..fields.len())]] = random_value(rng, 0);
        }
        1 => {
            v.as_object_mut().unwrap().remove(fields[rng.usize(..6)]);
        }
        2 => v["content"] = Value::String("x".repeat(4001 + rng.usize(..10_000))),
        3 => v["attachments"] = json!([{"type": "video", "url": "https://x/y.mp4"}]),
        4 => v["attachments"] = json!([{"type": "image", "url": "javascript:alert(1)"}]),
        5 => v["senderId"] = json!({"$ne": null}),
        6 => {
            let mut bytes = serde_json::to_vec(&v).unwrap();
            let n = rng.usize(..bytes.len());
            bytes.truncate(n);
            return bytes;
        }
        7 => {
            let mut bytes = serde_json::to_vec(&v).unwrap();
            for _ in 0..rng.usize(1..4) {
                let i = rng.usize(..bytes.len());
                bytes[i] = rng.u8(..);
            }
            return bytes;
        }
        _ => return (0..rng.usize(..200)).map(|_| rng.u8(..)).collect(),
    }
    serde_json::to_vec(&v).unwrap()
}

#[test]
fn thousands_of_malformed_events_never_panic_and_always_say_why() {
    let mut rng = fastrand::Rng::with_seed(0x7121_c800);
    let subject = format!("dm.bot.in.{KAORI}.{JESS_KAORI}");
    let mut rejected = 0;
    for _ in 0..20_000 {
        let payload = mutate(&mut rng);
        match parse_inbound(&payload, &subject, "dm.bot", LIMITS) {
            Ok(e) => {
                // A mutation may leave the event valid (e.g. a fresh valid id): then it must really be valid.
                assert_eq!(e.bot_id.to_hex(), KAORI);
                assert!(e.content.chars().count() <= 4000);
            }
            Err(e) => {
                rejected += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    assert!(
        rejected > 15_000,
        "most mutations are rejected ({rejected})"
    );
    let huge = vec![b'{'; 1 << 20];
    assert!(matches!(
        parse_inbound(&huge, &subject, "dm.bot", LIMITS),
        Err(InvalidEvent::TooLarge { .. })
    ));
}

#[tokio::test]
async fn a_worker_dead_letters_every_hostile_event_and_keeps_serving() {
    let env = TestEnv::new(always(StubReply::text("still here"))).await;
    env.spawn_app().await;
    let mut rng = fastrand::Rng::with_seed(42);
    let subject = env.bus.names.inbound(KAORI, JESS_KAORI);
    let prefix = env.config.nats.subject_prefix.clone();
    // Half on the real conversation (they pass its order gate one by one), the rest on made-up subjects.
    let subjects: Vec<String> = std::iter::once(subject.clone())
        .chain((0..8).map(|i| format!("{prefix}.in.{:024x}.{:024x}", i, rng.u64(..))))
        .chain(["x.y", "x", "a.b.c.d", "65f0.beef"].map(|t| format!("{prefix}.in.{t}")))
        .collect();
    let mut invalid = 0;
    for i in 0..2000 {
        let payload = mutate(&mut rng);
        let on = if rng.bool() {
            subject.clone()
        } else {
            subjects[rng.usize(..subjects.len())].clone()
        };
        if parse_inbound(&payload, &on, &prefix, LIMITS).is_err() {
            invalid += 1;
            env.publish_raw(on, &format!("hostile-{i}"), payload).await;
        }
    }
    // A 1 MB event too (the server accepts up to 2 MB; the worker refuses anything over 64 KiB).
    env.publish_raw(subject.clone(), "huge", vec![b'x'; 1 << 20])
        .await;
    invalid += 1;
    let good = env.dm(JESS, KAORI, JESS_KAORI, "you ok?").await;
    let mut replies = env.completions(JESS_KAORI).await;
    env.publish(&good).await;
    // It waits its turn behind the hostile events of its conversation (each dead-lettered in order).
    let reply = next_reply_to(&mut replies, &good.message_id, Duration::from_secs(120)).await;
    assert_eq!(reply.content, "still here");
    let all = eventually(Duration::from_secs(90), || async {
        env.dead_letters().await.len() >= invalid
    })
    .await;
    let dead = env.dead_letters().await;
    assert!(all, "{} of {invalid} dead-lettered", dead.len());
    assert_eq!(
        dead.len(),
        invalid,
        "each hostile event dead-lettered exactly once"
    );
    assert!(
        dead.iter().all(|(reason, _)| !reason.is_empty()),
        "every dead letter has a reason"
    );
    assert!(
        dead.iter().any(|(reason, payload)| payload.len() == 1 << 20
            && reason.contains("1048576 bytes, over the limit")),
        "the 1 MB event is dead-lettered with its size"
    );
    assert_eq!(
        env.stub.requests().len(),
        1,
        "no hostile event reached the model"
    );
    env.finish().await;
}
