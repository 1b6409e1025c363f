//! The tool loop against the scripted stub LLM, with real databases; and a full turn of the seed scenario.

use std::sync::Arc;

use crate::env::*;
use bson::doc;
use chrono::Utc;
use companion::testing::pipeline::{Outcome, tool_loop};
use companion_core::metrics::Metrics;
use companion_dev::stub::{StubReply, demo, scripted};
use companion_journal::State;
use companion_llm::{CallBudget, ChatRequest, LlmClient, Message};
use companion_store::{
    bus::event::DmEvent,
    store::{DM_MESSAGES, TRICKLISTS},
};
use companion_tools::tools::{Offer, REGISTRY};
use serde_json::{Value, json};

/// An environment whose model answers with `replies`, then "all done".
async fn env_with(replies: Vec<StubReply>) -> TestEnv {
    TestEnv::new(scripted(replies, StubReply::text("all done"))).await
}

/// Runs the loop for one event of Jess; returns its output and the requests the model received.
async fn run_loop(env: &TestEnv, tj: &ToolJob) -> (tool_loop::LoopOutput, Vec<Value>) {
    let out = run_within(env, tj, &CallBudget::new(8, 64_000))
        .await
        .expect("loop");
    (out, env.stub.requests())
}

/// The loop for "You are Kaori, a test." then "hi" to the model `stub` (100 tokens at most, temperature
/// 0), with a budget of requests and prompt tokens: every tool offered, no spend check, at most 3 tool
/// rounds of 16 KB results each.
async fn run_within(
    env: &TestEnv,
    tj: &ToolJob,
    budget: &CallBudget,
) -> Result<tool_loop::LoopOutput, companion::testing::pipeline::PipelineError> {
    let metrics = std::sync::Arc::new(Metrics::default());
    let llm = LlmClient::new(&env.config.llm, metrics.clone())?;
    let cx = tool_loop::LoopContext {
        slot: "",
        budget,
        spend: None,
        llm: &llm,
        registry: &REGISTRY,
        toolbox: &tj.tools,
        offer: Offer::all(),
        limits: tool_loop::LoopLimits {
            max_rounds: 3,
            max_result_bytes: 16 * 1024,
        },
        metrics: &metrics,
        tools: tj.ctx(),
    };
    let request = ChatRequest {
        model: "stub".into(),
        messages: vec![
            Message::system("You are Kaori, a test."),
            Message::user("hi"),
        ],
        tools: REGISTRY.offered(Offer::all()),
        tool_choice: None,
        max_tokens: Some(100),
        temperature: Some(0.0),
    };
    tool_loop::converse(&cx, request).await
}

/// Every assistant message with tool calls is followed by exactly its tool messages, in order.
fn assert_valid_conversation(messages: &[Value]) {
    let mut i = 0;
    while i < messages.len() {
        let m = &messages[i];
        if let Some(calls) = m["tool_calls"].as_array() {
            for (k, c) in calls.iter().enumerate() {
                let t = &messages[i + 1 + k];
                assert_eq!(t["role"], "tool");
                assert_eq!(t["tool_call_id"], c["id"]);
            }
            i += calls.len();
        } else {
            assert_ne!(m["role"], "tool", "orphan tool message at {i}");
        }
        i += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_calls_run_and_answer_in_order() {
    let f = env_with(vec![StubReply::ToolCalls(vec![
        (
            "search_spots".into(),
            json!({"query": "portland"}).to_string(),
        ),
        (
            "search_trickipedia".into(),
            json!({"query": "kickflip"}).to_string(),
        ),
        ("get_user_tricklists".into(), String::new()),
    ])])
    .await;
    let tj = f.tool_job(JESS).await;
    let (out, requests) = run_loop(&f, &tj).await;
    assert_eq!(out.text, "all done");
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0]["tools"].as_array().unwrap().len(), 15);
    assert_eq!(requests[1]["tools"].as_array().unwrap().len(), 15);
    let msgs = requests[1]["messages"].as_array().unwrap();
    assert_valid_conversation(msgs);
    let tools: Vec<&Value> = msgs.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(tools.len(), 3);
    assert!(tools[0]["content"].as_str().unwrap().contains("Burnside"));
    assert!(tools[1]["content"].as_str().unwrap().contains("Kickflip"));
    assert!(
        tools[2]["content"]
            .as_str()
            .unwrap()
            .contains("Park Essentials")
    );
    // The last card of the turn wins: search_trickipedia's trick_card (get_user_tricklists has none).
    assert_eq!(out.card.unwrap()["type"], "trick_card");
    assert_eq!(out.log.len(), 3);
    // The results and the final answer in text ride with the job's next record: here its settlement.
    assert!(
        tj.job
            .finish(State::Done, companion_journal::Finish::default())
            .await
            .unwrap()
    );
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM job_steps WHERE job = $1 AND name = 'tool'")
            .bind(tj.message_id.to_hex())
            .fetch_one(&f.pg.pool)
            .await
            .unwrap();
    assert_eq!(audited, 3);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_json_empty_arguments_and_unknown_tools_become_error_results() {
    let f = env_with(vec![StubReply::ToolCalls(vec![
        ("search_spots".into(), "{\"query\": ".into()),
        ("get_user_tricklists".into(), String::new()),
        ("drop_database".into(), "{}".into()),
        ("search_spots".into(), String::new()),
    ])])
    .await;
    let tj = f.tool_job(JESS).await;
    let (out, requests) = run_loop(&f, &tj).await;
    assert_eq!(out.text, "all done");
    let msgs = requests[1]["messages"].as_array().unwrap();
    assert_valid_conversation(msgs);
    let results: Vec<Value> = msgs
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| serde_json::from_str(m["content"].as_str().unwrap()).unwrap())
        .collect();
    assert!(
        results[0]["error"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );
    assert_eq!(results[1]["count"], 2);
    assert!(
        results[2]["error"]
            .as_str()
            .unwrap()
            .contains("unknown tool")
    );
    assert_eq!(results[3]["field"], "query");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_keeps_asking_for_tools_still_gets_one_text_reply() {
    let ask = StubReply::tool("search_spots", json!({"query": "park"}));
    let f = env_with(vec![ask.clone(), ask.clone(), ask.clone(), ask]).await;
    let tj = f.tool_job(JESS).await;
    let (out, requests) = run_loop(&f, &tj).await;
    assert_eq!(out.text, "all done");
    assert_eq!(out.log.len(), 3, "three rounds ran");
    assert_eq!(requests.len(), 5);
    // The fourth request for tools is not run: the final call offers no tools and its conversation is valid.
    let last = &requests[4];
    assert!(last.get("tools").is_none());
    let msgs = last["messages"].as_array().unwrap();
    assert_valid_conversation(msgs);
    assert_eq!(msgs.iter().filter(|m| m["role"] == "tool").count(), 3);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_cannot_act_for_another_user() {
    let f = env_with(vec![StubReply::ToolCalls(vec![
        (
            "create_tricklist".into(),
            json!({"name": "Hacked", "tricks": ["ollie"], "userId": SAM}).to_string(),
        ),
        (
            "get_user_tricklists".into(),
            json!({"user": {"$ref": "users", "$id": SAM}}).to_string(),
        ),
        (
            "share_content".into(),
            json!({"type": "tricklist", "id": "6650f1a2b3c4d5e6f7a8f003"}).to_string(),
        ),
    ])])
    .await;
    let tj = f.tool_job(JESS).await;
    let (out, requests) = run_loop(&f, &tj).await;
    assert_eq!(out.text, "all done");
    assert!(out.card.is_none());
    let msgs = requests[1]["messages"].as_array().unwrap();
    let results: Vec<Value> = msgs
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| serde_json::from_str(m["content"].as_str().unwrap()).unwrap())
        .collect();
    assert!(
        results.iter().all(|r| r.get("error").is_some()),
        "{results:?}"
    );
    assert!(
        results[0]["error"]
            .as_str()
            .unwrap()
            .contains("never for anyone else")
    );
    let hacked = f
        .mongo
        .collection(TRICKLISTS)
        .count_documents(doc! {"name": "Hacked"})
        .await
        .unwrap();
    assert_eq!(hacked, 0);
    f.finish().await;
}

/// The seed's scenario through a whole turn: the reply carries a `tricklist_card` and the list exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn park_list_scenario_end_to_end() {
    let f = TestEnv::new(demo()).await;
    let svc = f.spawn_app().await;
    let event = DmEvent {
        message_id: bson::oid::ObjectId::new(),
        conversation_id: oid(JESS_KAORI),
        sender_id: oid(JESS),
        bot_id: oid(KAORI),
        content: "make me a park list with kickflip, 50-50 and boardslide".into(),
        images: Vec::new(),
        sent_at: Utc::now(),
    };
    let outcome = svc.pipeline.process_dm(&event).await.expect("turn");
    let Outcome::Answered { reply_id } = outcome else {
        panic!("not answered: {outcome:?}")
    };
    let list = f
        .mongo
        .collection(TRICKLISTS)
        .find_one(doc! {"name": "Park List", "createdBy": "Kaori"})
        .await
        .unwrap()
        .expect("the tricklist");
    assert_eq!(
        list.get_document("user").unwrap(),
        &doc! {"$ref": "users", "$id": oid(JESS)}
    );
    assert_eq!(list.get_array("tricks").unwrap().len(), 3);
    let reply = f
        .mongo
        .collection(DM_MESSAGES)
        .find_one(doc! {"_id": oid(&reply_id)})
        .await
        .unwrap()
        .expect("reply");
    let rich = reply.get_document("richContent").unwrap();
    assert_eq!(rich.get_str("type").unwrap(), "tricklist_card");
    assert_eq!(
        rich.get_document("data").unwrap().get_str("_id").unwrap(),
        list.get_object_id("_id").unwrap().to_hex()
    );
    assert!(reply.get_str("content").unwrap().contains("Park List"));
    let log: Value =
        sqlx::query_scalar("SELECT tool_calls FROM bot_conversations WHERE message_id = $1")
            .bind(&reply_id)
            .fetch_one(&f.pg.pool)
            .await
            .unwrap();
    assert_eq!(log[0]["tool"], "create_tricklist");
    assert_eq!(log[0]["ok"], true);
    let requests = f.stub.requests();
    let offered: Vec<&str> = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(offered.contains(&"create_tricklist"), "{offered:?}");
    // Delivering again (a redelivered event) creates nothing new.
    assert_eq!(
        svc.pipeline.process_dm(&event).await.unwrap(),
        Outcome::AlreadySettled { state: State::Done }
    );
    let n = f
        .mongo
        .collection(TRICKLISTS)
        .count_documents(doc! {"name": "Park List"})
        .await
        .unwrap();
    assert_eq!(n, 1);
    f.finish().await;
}

#[tokio::test]
async fn the_per_turn_ceiling_ends_the_loop_with_text_and_refuses_an_oversized_prompt() {
    // A model that asks for a tool whenever it may: with two requests allowed, the second goes without
    // tools and its text ends the turn.
    let greedy: companion_dev::stub::Responder = Arc::new(|body: &Value| {
        if body["tools"].as_array().is_some_and(|t| !t.is_empty()) {
            StubReply::ToolCalls(vec![("get_user_tricklists".into(), String::new())])
        } else {
            StubReply::text("that's all i can look up right now")
        }
    });
    let env = TestEnv::new(greedy).await;
    let tj = env.tool_job(JESS).await;
    let budget = CallBudget::new(2, 64_000);
    let out = run_within(&env, &tj, &budget).await.expect("a text answer");
    assert_eq!(out.text, "that's all i can look up right now");
    let asked = env.stub.requests();
    assert_eq!(asked.len(), 2, "two requests, not max_rounds + 1");
    assert!(
        asked[1].get("tools").is_none(),
        "the last one without tools"
    );
    assert_eq!(budget.calls_left(), 0);

    // A prompt larger than the token ceiling is never sent.
    let tj = env.tool_job(JESS).await;
    let e = run_within(&env, &tj, &CallBudget::new(8, 100))
        .await
        .expect_err("over the ceiling");
    assert!(e.to_string().contains("prompt tokens"), "{e}");
    assert_eq!(env.stub.requests().len(), 2, "nothing more was sent");
    env.finish().await;
}
