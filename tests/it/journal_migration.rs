//! `companion migrate` on a database of the earlier journal (`turns`, `turn_steps`, `tool_calls`,
//! `llm_usage`, `tool_writes`): the rows move into `jobs` and `job_steps`, read back as the new core reads
//! them, and the old tables are gone.

use companion::testing::pipeline::{Burst, FloodDecision, Reply, tool_loop::LlmRecord};
use companion::testing::steps::{BURST, FLOOD, REPLY};
use companion_dev::stub::{StubReply, always};
use companion_journal::{Journal, NewJob, State};
use companion_limits::calls::LLM;
use companion_llm::CallUsage;
use companion_store::store::MIGRATOR;
use companion_tools::tools::{TOOL, ToolRecord, call_key};
use serde_json::json;
use sqlx::Row;

use crate::env::*;

/// The last migration of the earlier journal.
const BEFORE_JOURNAL: i64 = 20261122060000;

#[tokio::test]
async fn the_earlier_journal_moves_into_jobs_and_steps() {
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    let pool = &env.pg.pool;
    // Back to an empty database (the `vector` extension, which only a superuser creates, stays).
    sqlx::query(
        "DO $$ DECLARE t text; BEGIN
           FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = 'public' LOOP
             EXECUTE format('DROP TABLE %I CASCADE', t);
           END LOOP;
         END $$",
    )
    .execute(pool)
    .await
    .unwrap();
    MIGRATOR
        .run_to(BEFORE_JOURNAL, &mut *pool.lease().await.unwrap())
        .await
        .unwrap();

    // A turn answered with a burst; one over the flood limit answered by it; one still running after a
    // model step, a write tool call and a paid call that lost a race.
    let (done, limited, running, covered) = (
        "6b0000000000000000000001",
        "6b0000000000000000000002",
        "6b0000000000000000000003",
        "6b0000000000000000000004",
    );
    sqlx::query(
        "INSERT INTO turns (message_id, conversation_id, user_id, bot_id, state, reply_id, reply_content,
                            rich_content, reply_at, covers, stream_seq)
         VALUES ($1, $2, $3, $4, 'done', '6c0000000000000000000001', 'hey!', '{\"type\": \"x\"}', now(),
                 $5, 7)",
    )
    .bind(done)
    .bind(JESS_KAORI)
    .bind(JESS)
    .bind(KAORI)
    .bind(json!([{"messageId": covered, "seq": 8, "content": "and more", "images": [],
                  "sentAt": "2026-11-22T10:00:00Z"}]))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO turns (message_id, conversation_id, user_id, bot_id, state, covered_by)
         VALUES ($1, $3, $4, $5, 'covered', $2), ($6, $3, $4, $5, 'limited', $2),
                ($7, $3, $4, $5, 'running', NULL)",
    )
    .bind(covered)
    .bind(done)
    .bind(JESS_KAORI)
    .bind(JESS)
    .bind(KAORI)
    .bind(limited)
    .bind(running)
    .execute(pool)
    .await
    .unwrap();
    let answer = json!({"content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "create_tricklist", "arguments": "{\"name\":\"A\"}"}}]});
    sqlx::query("INSERT INTO turn_steps (message_id, step, response) VALUES ($1, 0, $2)")
        .bind(running)
        .bind(&answer)
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO llm_usage (message_id, step, user_id, bot_id, model, prompt_tokens,
                                completion_tokens, cost_usd, cost_source)
         VALUES ($1, 0, $2, $3, 'm/one', 100, 10, 0.5, 'reported'),
                ($1, 0, $2, $3, 'm/one', 100, 12, 0.25, 'reported')",
    )
    .bind(running)
    .bind(JESS)
    .bind(KAORI)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO tool_calls (message_id, tool_call_id, round, user_id, bot_id, tool, arguments, ok,
                                 result, card_type, duration_ms)
         VALUES ($1, 'call_1', 1, $2, $3, 'create_tricklist', '{\"name\":\"A\"}', true,
                 '{\"data\": {\"_id\": \"l1\"}, \"card\": {\"type\": \"tricklist_card\"}}', 'tricklist_card', 12)",
    )
    .bind(running)
    .bind(JESS)
    .bind(KAORI)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO tool_writes (message_id, tool_call_id, user_id, tool, created_at)
         VALUES ($1, 'call_1', $2, 'create_tricklist', now())",
    )
    .bind(running)
    .bind(JESS)
    .execute(pool)
    .await
    .unwrap();

    MIGRATOR
        .run(&mut *pool.lease().await.unwrap())
        .await
        .unwrap();

    let journal = Journal::new(pool.clone());
    let get = |id: &'static str| {
        let journal = journal.clone();
        async move { journal.get(id).await.unwrap().expect("a job") }
    };
    assert_eq!(get(done).await.state, State::Done);
    assert_eq!(get(done).await.stream_seq, Some(7));
    let c = get(covered).await;
    assert_eq!(
        (c.state, c.covered_by.as_deref()),
        (State::Covered, Some(done))
    );
    let l = get(limited).await;
    assert_eq!(
        (l.state, l.covered_by.as_deref()),
        (State::Limited, Some(done))
    );

    let open = |id: &'static str| {
        let journal = journal.clone();
        async move {
            journal
                .open(&NewJob {
                    id,
                    kind: "turn",
                    user: JESS,
                    bot: KAORI,
                    conversation: JESS_KAORI,
                    stream_seq: None,
                    reads: Default::default(),
                })
                .await
                .unwrap()
        }
    };
    let job = open(done).await;
    let reply: Reply = job.recorded(&REPLY, "g0").expect("the reply");
    assert_eq!(
        (reply.id.as_str(), reply.content.as_str()),
        ("6c0000000000000000000001", "hey!")
    );
    let burst: Burst = job.recorded(&BURST, "").expect("the burst");
    assert_eq!(burst.last_seq(), Some(8));
    let flood: FloodDecision = open(limited)
        .await
        .recorded(&FLOOD, "")
        .expect("the decision");
    assert_eq!(flood.by.as_deref(), Some(done));

    // The running turn resumes from its journal: the model's answer with its usage, the tool's result
    // under the key the tool loop looks it up by.
    let job = open(running).await;
    let llm: LlmRecord = job.recorded(&LLM, "0").expect("the model's answer");
    assert_eq!(llm.message.tool_calls[0].function.name, "create_tricklist");
    let usage: CallUsage = llm.usage.expect("its usage");
    assert_eq!((usage.prompt_tokens, usage.cost_usd), (100, Some(0.5)));
    let key = call_key("call_1", "create_tricklist", "{\"name\":\"A\"}");
    let tool: ToolRecord = job.recorded(&TOOL, &key).expect("the tool's result");
    assert!(tool.ok);
    assert_eq!(tool.content, json!({"_id": "l1"}));
    assert_eq!(tool.card, Some(json!({"type": "tricklist_card"})));
    // Both paid calls count, the write quota's ledger too.
    let rows = companion::testing::usage::summary(pool, 1, None)
        .await
        .unwrap();
    assert_eq!(rows.iter().map(|r| r.calls).sum::<i64>(), 2, "{rows:?}");
    let counted: i64 =
        sqlx::query_scalar("SELECT count(*) FROM job_steps WHERE tally = $1 AND name = 'quota'")
            .bind(format!("writes:{JESS}"))
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(counted, 1);
    let old: Vec<String> = sqlx::query(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public'
         AND tablename IN ('turns', 'turn_steps', 'tool_calls', 'llm_usage', 'tool_writes')",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect();
    assert!(old.is_empty(), "{old:?}");
    env.finish().await;
}
