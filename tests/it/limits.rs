//! Output bounds: a model response larger than `LLM_MAX_RESPONSE_BYTES` is refused (the user gets the
//! honest failure line), and a tool result longer than `COMPANION_MAX_TOOL_RESULT_BYTES` reaches the
//! model cut, with a note; a reply longer than `COMPANION_MAX_REPLY_CHARS` is stored and published cut.

use std::sync::Arc;

use crate::env::*;
use companion_dev::stub::{Responder, StubReply, always};
use serde_json::Value;

#[tokio::test]
async fn an_oversized_model_response_is_refused_and_the_user_gets_the_failure_line() {
    let env_reply = StubReply::text("a".repeat(100_000));
    let env = TestEnv::with(always(env_reply), |c| {
        c.llm.max_response_bytes = 32 * 1024;
    })
    .await;
    env.spawn_app().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "say a lot").await;
    let reply = env.turn(&event).await;
    assert_eq!(reply.content, failure_line("kaori"));
    assert_eq!(
        env.stub.requests().len(),
        1,
        "not retried: the answer would be as large"
    );
    let last_error: Option<String> =
        sqlx::query_scalar("SELECT last_error FROM jobs WHERE id = $1")
            .bind(&event.message_id)
            .fetch_one(&env.pg.pool)
            .await
            .unwrap();
    assert!(
        last_error
            .unwrap_or_default()
            .contains("larger than 32768 bytes"),
        "the journal says why"
    );
    env.finish().await;
}

#[tokio::test]
async fn a_long_tool_result_reaches_the_model_cut_with_a_note() {
    let responder: Responder = Arc::new(|body: &Value| {
        if last_message(body)["role"] == "tool" {
            StubReply::text("that's a lot of lists")
        } else {
            StubReply::ToolCalls(vec![("get_user_tricklists".into(), String::new())])
        }
    });
    let env = TestEnv::with(responder, |c| c.turn.max_tool_result_bytes = 200).await;
    env.spawn_app().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "all my lists please").await;
    let reply = env.turn(&event).await;
    assert_eq!(reply.content, "that's a lot of lists");
    let requests = env.stub.requests();
    let tool = last_message(&requests[1]);
    assert_eq!(tool["role"], "tool");
    let content = tool["content"].as_str().unwrap();
    let (kept, note) = content
        .split_once("… [cut: the result had ")
        .expect(content);
    assert!(kept.len() <= 200 && kept.len() > 150, "{content}");
    let full: usize = note.split(' ').next().unwrap().parse().unwrap();
    assert!(full > 200, "the full result was longer: {note}");
    // The journal keeps the whole result.
    let stored: Value =
        sqlx::query_scalar("SELECT output FROM job_steps WHERE job = $1 AND name = 'tool'")
            .bind(&event.message_id)
            .fetch_one(&env.pg.pool)
            .await
            .unwrap();
    assert!(stored["content"].to_string().len() > 200);
    env.finish().await;
}

#[tokio::test]
async fn a_reply_longer_than_the_limit_is_cut_with_an_ellipsis() {
    let env = TestEnv::with(always(StubReply::text("ollie ".repeat(50))), |c| {
        c.turn.max_reply_chars = 20;
    })
    .await;
    env.spawn_app().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "talk to me").await;
    let reply = env.turn(&event).await;
    assert_eq!(
        reply.content,
        format!(
            "{}…",
            "ollie ".repeat(50).chars().take(20).collect::<String>()
        )
    );
    let stored = env.replies_to(&event.message_id).await;
    assert_eq!(stored[0].get_str("content").unwrap(), reply.content);
    env.finish().await;
}
