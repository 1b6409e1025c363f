//! Durable turns: a turn retried after a tool ran replays the journaled model responses and the
//! recorded tool results, so no tool runs again and no paid call is repeated.

use crate::env::*;
use bson::doc;
use companion::testing::pipeline::Outcome;
use companion_dev::stub::StubReply;
use serde_json::{Value, json};

#[tokio::test]
async fn a_turn_retried_after_a_write_creates_one_tricklist_and_pays_each_step_once() {
    // Step 0 always asks to create a list (with a fresh call id each time it is asked); step 1 fails once.
    let responder = tool_then_one_500(
        StubReply::tool(
            "create_tricklist",
            json!({"name": "Retry Park", "tricks": ["Kickflip", "Ollie"], "category": "skateboard"}),
        ),
        StubReply::text("your Retry Park list is ready!"),
    );
    let env = TestEnv::with(responder, |c| c.llm.max_retries = 0).await;
    let svc = env.spawn_app().await;
    let raw = env
        .dm(
            JESS,
            KAORI,
            JESS_KAORI,
            "make me a park list with kickflip and ollie",
        )
        .await;
    let event = dm_event(&raw);
    let first = svc.pipeline.process_dm(&event).await;
    assert!(
        first.is_err(),
        "the first attempt fails after the write: {first:?}"
    );
    let second = svc
        .pipeline
        .process_dm(&event)
        .await
        .expect("the retry completes");
    assert!(matches!(second, Outcome::Answered { .. }));

    let lists = env
        .mongo
        .collection("tricklists")
        .count_documents(doc! { "name": "Retry Park" })
        .await
        .unwrap();
    assert_eq!(lists, 1, "exactly one tricklist");
    // attempt 1: step 0 + failed step 1; attempt 2: step 1 only (step 0 replayed from the journal)
    assert_eq!(env.stub.requests().len(), 3);
    let replies = env.replies_to(&raw.message_id).await;
    assert_eq!(replies.len(), 1);
    assert_eq!(
        replies[0].get_str("content").unwrap(),
        "your Retry Park list is ready!"
    );
    assert_eq!(
        replies[0]
            .get_document("richContent")
            .unwrap()
            .get_str("type")
            .unwrap(),
        "tricklist_card"
    );
    let writes: i64 = sqlx::query_scalar("SELECT count(*) FROM job_steps WHERE name = 'quota'")
        .fetch_one(&env.pg.pool)
        .await
        .unwrap();
    assert_eq!(writes, 1, "the write quota counted the write once");
    env.finish().await;
}

#[tokio::test]
async fn a_retried_turn_gives_the_model_the_tool_results_of_the_first_attempt() {
    // Step 0 searches spots; step 1 fails once, then answers.
    let responder = tool_then_one_500(
        StubReply::tool("search_spots", json!({"query": "Portland"})),
        StubReply::text("found some spots"),
    );
    let env = TestEnv::with(responder, |c| c.llm.max_retries = 0).await;
    let svc = env.spawn_app().await;
    let raw = env.dm(JESS, KAORI, JESS_KAORI, "spots in portland?").await;
    let event = dm_event(&raw);
    assert!(
        svc.pipeline.process_dm(&event).await.is_err(),
        "the first attempt fails after the search"
    );
    // A spot appears between the attempts: a search run again would find it.
    env.mongo
        .collection("ck_spots")
        .insert_one(doc! { "name": "Brand New Portland Bowl", "type": "skatepark", "city": "Portland", "country": "USA" })
        .await
        .unwrap();
    let second = svc
        .pipeline
        .process_dm(&event)
        .await
        .expect("the retry completes");
    assert!(matches!(second, Outcome::Answered { .. }));
    let requests = env.stub.requests();
    let tool_result = |r: &Value| {
        last_message(r)["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let (first_seen, replayed) = (tool_result(&requests[1]), tool_result(&requests[2]));
    assert!(first_seen.contains("Burnside"), "{first_seen}");
    let parse = |s: &str| serde_json::from_str::<Value>(s).expect("a JSON tool result");
    assert_eq!(
        parse(&replayed),
        parse(&first_seen),
        "the retry replays the recorded result"
    );
    assert!(
        !replayed.contains("Brand New Portland Bowl"),
        "the tool did not run again"
    );
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM job_steps WHERE name = 'tool'")
        .fetch_one(&env.pg.pool)
        .await
        .unwrap();
    assert_eq!(audited, 1);
    env.finish().await;
}

#[tokio::test]
async fn an_answer_calling_only_tools_that_read_is_recorded_with_the_reply_and_one_calling_a_tool_that_acts_before_it()
 {
    let responder: companion_dev::stub::Responder = std::sync::Arc::new(|body: &Value| {
        let last = last_message(body);
        if last["role"] != "user" {
            return StubReply::text("there you go");
        }
        if last["content"]
            .as_str()
            .unwrap_or_default()
            .contains("spots")
        {
            StubReply::tool("search_spots", json!({"query": "Portland"}))
        } else {
            // A tool that acts with no counted step of its own (which would write the record first).
            StubReply::tool("mark_trick_landed", json!({"trick": "Kickflip"}))
        }
    });
    let env = TestEnv::new(responder).await;
    let svc = env.spawn_app().await;
    for (text, reads) in [
        ("any spots in portland?", true),
        ("i landed my kickflip!", false),
    ] {
        let raw = env.dm(JESS, KAORI, JESS_KAORI, text).await;
        let outcome = svc.pipeline.process_dm(&dm_event(&raw)).await;
        assert!(
            matches!(outcome, Ok(Outcome::Answered { .. })),
            "{outcome:?}"
        );
        // The transaction that wrote each record: the tool-call answer (`llm` 0), the text answer
        // (`llm` 1) and the reply.
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT name, key, xmin::text FROM job_steps
             WHERE job = $1 AND name IN ('llm', 'reply') ORDER BY name, key",
        )
        .bind(&raw.message_id)
        .fetch_all(&env.pg.pool)
        .await
        .unwrap();
        let names: Vec<String> = rows.iter().map(|r| format!("{}/{}", r.0, r.1)).collect();
        assert_eq!(names, ["llm/0", "llm/1", "reply/g0"], "{text}");
        let (call, answer, reply) = (&rows[0].2, &rows[1].2, &rows[2].2);
        assert_eq!(
            answer, reply,
            "{text}: the text answer rides with the reply"
        );
        if reads {
            assert_eq!(
                call, reply,
                "{text}: an answer calling a tool that reads rides too"
            );
        } else {
            assert_ne!(
                call, reply,
                "{text}: an answer calling a tool that acts is recorded before the tool acts"
            );
        }
    }
    env.finish().await;
}

#[tokio::test]
async fn a_reply_s_history_is_written_by_the_statement_that_records_it() {
    let env = TestEnv::new(companion_dev::stub::always(StubReply::text("sure thing"))).await;
    let svc = env.spawn_app().await;
    let raw = env.dm(JESS, KAORI, JESS_KAORI, "you around?").await;
    let outcome = svc.pipeline.process_dm(&dm_event(&raw)).await;
    let Ok(Outcome::Answered { reply_id }) = outcome else {
        panic!("{outcome:?}")
    };
    // The transaction that wrote the reply's record, and those that wrote the two history rows.
    let record: String =
        sqlx::query_scalar("SELECT xmin::text FROM job_steps WHERE job = $1 AND name = 'reply'")
            .bind(&raw.message_id)
            .fetch_one(&env.pg.pool)
            .await
            .unwrap();
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT role, xmin::text FROM bot_conversations WHERE message_id = ANY($1) ORDER BY id",
    )
    .bind(vec![raw.message_id.clone(), reply_id])
    .fetch_all(&env.pg.pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            ("user".to_owned(), record.clone()),
            ("assistant".to_owned(), record)
        ]
    );
    env.finish().await;
}
