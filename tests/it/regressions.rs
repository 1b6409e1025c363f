//! A model answer that must not be recorded (an error inside a 200, an empty answer) is asked for again,
//! and a NUL character in a user's text is cleaned at validation and answered at once.

use std::time::Duration;

use crate::env::*;
use companion_dev::stub::{StubReply, scripted};
use serde_json::json;

/// OpenRouter's error inside a 200: a choice that ended in `finish_reason: "error"`, no content.
fn error_choice() -> StubReply {
    StubReply::Raw(json!({
        "id": "gen-err", "object": "chat.completion", "model": "stub",
        "choices": [{"index": 0, "finish_reason": "error", "native_finish_reason": "error",
                     "message": {"role": "assistant", "content": ""},
                     "error": {"code": 502, "message": "upstream provider dropped the stream"}}]
    }))
}

async fn one_bad_answer_then_a_good_one(bad: StubReply) {
    let env = TestEnv::with(scripted(vec![bad], StubReply::text("all good now")), |c| {
        c.llm.retry_base_ms = 10;
    })
    .await;
    env.spawn_app().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "you there?").await;
    let mut replies = env.completions(JESS_KAORI).await;
    env.publish(&event).await;
    let reply = next_reply_to(&mut replies, &event.message_id, Duration::from_secs(20)).await;
    assert_eq!(reply.content, "all good now", "the model was asked again");
    assert_eq!(env.stub.requests().len(), 2);
    assert_eq!(env.replies_to(&event.message_id).await.len(), 1);
    env.finish().await;
}

#[tokio::test]
async fn an_error_choice_inside_a_200_is_not_recorded_and_the_model_is_asked_again() {
    one_bad_answer_then_a_good_one(error_choice()).await;
}

#[tokio::test]
async fn an_empty_answer_is_not_recorded_and_the_model_is_asked_again() {
    one_bad_answer_then_a_good_one(StubReply::text("")).await;
}

#[tokio::test]
async fn a_nul_character_is_cleaned_at_validation_and_answered_at_once() {
    let env = TestEnv::new(scripted(vec![], StubReply::text("got it"))).await;
    env.spawn_app().await;
    let event = env
        .dm(
            JESS,
            KAORI,
            JESS_KAORI,
            "kickflip\u{0000} tips\u{0007}?\tplease\nthanks",
        )
        .await;
    let mut replies = env.completions(JESS_KAORI).await;
    env.publish(&event).await;
    let reply = next_reply_to(&mut replies, &event.message_id, Duration::from_secs(8)).await;
    assert_eq!(reply.content, "got it", "answered, not the failure line");
    let sent = env.stub.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        last_message(&sent[0])["content"],
        "kickflip tips?\tplease\nthanks",
        "NUL and other C0 controls removed, tab and newline kept"
    );
    assert!(env.dead_letters().await.is_empty());
    env.finish().await;
}
