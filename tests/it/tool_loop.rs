//! The tool loop against the scripted stub LLM, with real databases; and a full turn of the seed scenario.

use std::{path::PathBuf, sync::Arc};

use crate::fixture::*;
use bson::doc;
use chrono::Utc;
use companion::{
    Config, Services,
    bus::DmEvent,
    llm::{ChatRequest, LlmClient, Message},
    store::mongo::{DM_MESSAGES, TRICKLISTS},
    tools::{REGISTRY, ToolContext},
    turn::{self, Outcome, tool_loop},
};
use companion_dev::stub::{StubLlm, StubReply, demo, scripted};
use serde_json::{Value, json};

fn config_for(stub: &StubLlm, f: &Fixture) -> Config {
    let mut c = Config::from_env().expect("config");
    c.llm_base_url = stub.base_url.clone();
    c.openrouter_api_key = Default::default();
    c.atlas_uri = crate::env::replace_db(&c.atlas_uri, &f.mongo_db);
    c.postgres_url = f.pg_url.clone();
    let tag = unique_name();
    c.subject_prefix = format!("{tag}.bot");
    c.stream_prefix = tag.to_uppercase();
    c.consumer = format!("{tag}-worker");
    c.characters_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("characters");
    c
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "stub".into(),
        messages: vec![
            Message::system("You are Kaori, a test."),
            Message::user("hi"),
        ],
        tools: REGISTRY.defs(),
        tool_choice: None,
        max_tokens: Some(100),
        temperature: Some(0.0),
    }
}

async fn run_loop(
    replies: Vec<StubReply>,
    ctx: &ToolContext,
    f: &Fixture,
) -> (tool_loop::LoopOutput, Vec<Value>) {
    let stub = StubLlm::start(scripted(replies, StubReply::text("all done")))
        .await
        .unwrap();
    let llm = LlmClient::new(&config_for(&stub, f)).unwrap();
    let out = tool_loop::run_llm(&llm, ctx, &REGISTRY, request(), 3)
        .await
        .expect("loop");
    (out, stub.requests())
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
    let f = Fixture::new().await;
    let ctx = f.ctx(JESS);
    let (out, requests) = run_loop(
        vec![StubReply::ToolCalls(vec![
            (
                "search_spots".into(),
                json!({"query": "portland"}).to_string(),
            ),
            (
                "search_trickipedia".into(),
                json!({"query": "kickflip"}).to_string(),
            ),
            ("get_user_tricklists".into(), String::new()),
        ])],
        &ctx,
        &f,
    )
    .await;
    assert_eq!(out.text, "all done");
    assert_eq!(out.llm_calls, 2);
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0]["tools"].as_array().unwrap().len(), 6);
    assert_eq!(requests[1]["tools"].as_array().unwrap().len(), 6);
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
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM tool_calls WHERE message_id = $1")
        .bind(ctx.message_id.to_hex())
        .fetch_one(&f.pg.pool)
        .await
        .unwrap();
    assert_eq!(audited, 3);
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_json_empty_arguments_and_unknown_tools_become_error_results() {
    let f = Fixture::new().await;
    let ctx = f.ctx(JESS);
    let (out, requests) = run_loop(
        vec![StubReply::ToolCalls(vec![
            ("search_spots".into(), "{\"query\": ".into()),
            ("get_user_tricklists".into(), String::new()),
            ("drop_database".into(), "{}".into()),
            ("search_spots".into(), String::new()),
        ])],
        &ctx,
        &f,
    )
    .await;
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
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_keeps_asking_for_tools_still_gets_one_text_reply() {
    let f = Fixture::new().await;
    let ctx = f.ctx(JESS);
    let ask = StubReply::tool("search_spots", json!({"query": "park"}));
    let (out, requests) =
        run_loop(vec![ask.clone(), ask.clone(), ask.clone(), ask], &ctx, &f).await;
    assert_eq!(out.text, "all done");
    assert_eq!(out.log.len(), 3, "three rounds ran");
    assert_eq!(requests.len(), 5);
    // The fourth request for tools is not run: the final call offers no tools and its conversation is valid.
    let last = &requests[4];
    assert!(last.get("tools").is_none());
    let msgs = last["messages"].as_array().unwrap();
    assert_valid_conversation(msgs);
    assert_eq!(msgs.iter().filter(|m| m["role"] == "tool").count(), 3);
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_cannot_act_for_another_user() {
    let f = Fixture::new().await;
    let ctx = f.ctx(JESS);
    let (out, requests) = run_loop(
        vec![StubReply::ToolCalls(vec![
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
        ])],
        &ctx,
        &f,
    )
    .await;
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
    f.cleanup().await;
}

/// The seed's scenario through a whole turn: the reply carries a `tricklist_card` and the list exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn park_list_scenario_end_to_end() {
    let f = Fixture::new().await;
    let stub = StubLlm::start(demo()).await.unwrap();
    let svc: Arc<Services> = Services::connect(config_for(&stub, &f))
        .await
        .expect("services");
    svc.bus.ensure_streams().await.expect("streams");
    let event = DmEvent {
        message_id: bson::oid::ObjectId::new(),
        conversation_id: oid(JESS_KAORI_CONVERSATION),
        sender_id: oid(JESS),
        bot_id: oid(KAORI),
        content: "make me a park list with kickflip, 50-50 and boardslide".into(),
        images: Vec::new(),
        sent_at: Utc::now(),
    };
    let outcome = turn::run(&svc, &event).await.expect("turn");
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
    let requests = stub.requests();
    assert_eq!(requests[0]["tools"].as_array().unwrap().len(), 6);
    // Delivering again (a redelivered event) creates nothing new.
    assert_eq!(
        turn::run(&svc, &event).await.unwrap(),
        Outcome::AlreadySettled {
            state: "done".into()
        }
    );
    let n = f
        .mongo
        .collection(TRICKLISTS)
        .count_documents(doc! {"name": "Park List"})
        .await
        .unwrap();
    assert_eq!(n, 1);
    for s in [
        &svc.bus.names.stream_in,
        &svc.bus.names.stream_out,
        &svc.bus.names.stream_dlq,
    ] {
        let _ = svc.bus.js.delete_stream(s).await;
    }
    f.cleanup().await;
}
