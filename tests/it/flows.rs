//! Guided flows on the real stack: the three shipped flows end to end with a scripted model (a worker
//! restart and a repeated delivery in the middle), a slot value the step refuses, leaving a flow, a flow
//! expiring, and invalid flow files refused at start-up.

use std::{sync::Arc, time::Duration};

use bson::{doc, oid::ObjectId};
use companion_dev::stub::{Responder, StubReply, last_user_text};
use serde_json::{Value, json};

use crate::{env::*, proactive::next_proactive};

/// One scripted move of the model: a tool call (arguments from the request so far) or a final text.
#[derive(Clone)]
enum Move {
    Tool(&'static str, fn(&Value) -> Value),
    /// A tool call whose id is always `call_same` (some models reuse ids across turns).
    SameId(&'static str, fn(&Value) -> Value),
    Text(&'static str),
}

/// A chat completion asking for one tool call with the given id.
fn call_with_id(id: &str, name: &str, args: Value) -> StubReply {
    StubReply::Raw(json!({
        "id": "chatcmpl-same", "object": "chat.completion", "model": "stub",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null,
            "tool_calls": [{"id": id, "type": "function",
                            "function": {"name": name, "arguments": args.to_string()}}]
        }}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    }))
}

/// A model that answers each user line with its moves, in order: the n-th request after the line (n
/// tool results since it) makes the n-th move.
fn script(lines: Vec<(&'static str, Vec<Move>)>) -> Responder {
    Arc::new(move |body: &Value| {
        let user = last_user_text(body);
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let since_user = messages
            .iter()
            .rev()
            .take_while(|m| m["role"] != "user")
            .filter(|m| m["role"] == "tool")
            .count();
        let moves = lines
            .iter()
            .find(|(l, _)| user.contains(l))
            .map(|(_, m)| m.clone())
            .unwrap_or_else(|| vec![Move::Text("ok")]);
        match moves.get(since_user).or(moves.last()) {
            Some(Move::Tool(name, args)) if since_user < moves.len() => {
                StubReply::tool(name, args(body))
            }
            Some(Move::SameId(name, args)) if since_user < moves.len() => {
                call_with_id("call_same", name, args(body))
            }
            Some(Move::Text(t)) => StubReply::text(*t),
            _ => StubReply::text("ok"),
        }
    })
}

/// The `_id` in the newest tool result of the request.
fn last_result_id(body: &Value) -> String {
    last_result_field(body, "_id")
}

/// A field of the newest tool result of the request.
fn last_result_field(body: &Value, field: &str) -> String {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .and_then(|m| serde_json::from_str::<Value>(m["content"].as_str()?).ok())
        .and_then(|v| v[field].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("a tool result with {field}"))
}

/// (flow, step, status, slots) of Jess's flow with Kaori.
async fn flow_of(env: &TestEnv) -> Option<(String, String, String, Value)> {
    sqlx::query_as(
        "SELECT flow, step, status, slots FROM flow_states WHERE user_id = $1 AND bot_id = $2",
    )
    .bind(JESS)
    .bind(KAORI)
    .fetch_optional(&env.pg.pool)
    .await
    .unwrap()
}

async fn step_status(env: &TestEnv) -> (String, String) {
    let (_, step, status, _) = flow_of(env).await.expect("a flow");
    (step, status)
}

/// The draft in the flow's `slots` is real and named Hollow Bowl; a moderator approves it as TB-Backend's
/// admin tool would (stored, then published); returns the companion's follow-up.
async fn approve_hollow_bowl(
    env: &TestEnv,
    slots: &Value,
) -> companion_store::bus::event::Completion {
    let draft = ObjectId::parse_str(slots["draft_id"].as_str().unwrap()).unwrap();
    let stored = env
        .mongo
        .collection("spot_drafts")
        .find_one(doc! {"_id": draft})
        .await
        .unwrap()
        .expect("the draft is real");
    assert_eq!(stored.get_str("name").unwrap(), "Hollow Bowl");
    let mut replies = env.completions(JESS_KAORI).await;
    env.mongo
        .collection("spot_drafts")
        .update_one(doc! {"_id": draft}, doc! {"$set": {"status": "approved"}})
        .await
        .unwrap();
    companion_dev::backend::publish_spot_review(
        &env.bus,
        draft,
        &json!({"draftId": draft.to_hex(), "status": "approved", "reviewedAt": "2026-11-24T10:00:00Z"}),
    )
    .await
    .unwrap();
    next_proactive(&mut replies, Duration::from_secs(30)).await
}

/// Jess says `text` to Kaori and gets the reply.
async fn say(env: &TestEnv, text: &str) -> companion_store::bus::event::Completion {
    let e = env.dm(JESS, KAORI, JESS_KAORI, text).await;
    env.turn(&e).await
}

/// Delivers the last message of the conversation again (another id for the same event): settled already,
/// it changes nothing.
async fn deliver_again(env: &TestEnv, text: &str) {
    let e = env.dm(JESS, KAORI, JESS_KAORI, text).await;
    // The original first, then the same message once more through a new stream message.
    env.turn(&e).await;
    let after_first = (flow_of(env).await, env.stub.requests().len());
    env.publish_raw(
        env.bus.names.inbound(KAORI, JESS_KAORI),
        &format!("{}-again", e.message_id),
        serde_json::to_vec(&e).unwrap(),
    )
    .await;
    env.drained(Drained::Inbound).await;
    assert_eq!(
        (flow_of(env).await, env.stub.requests().len()),
        after_first,
        "a repeated delivery moves nothing and asks nothing"
    );
}

/// A filled slot of the flow, as the system prompt shows it to the model.
fn slot_in_prompt(body: &Value, slot: &str) -> String {
    let system = system_prompt(body);
    let at = system
        .find(&format!("\"{slot}\":\""))
        .unwrap_or_else(|| panic!("{slot} in the prompt: {system}"));
    system[at + slot.len() + 4..].chars().take(24).collect()
}

fn system_prompt(body: &serde_json::Value) -> String {
    system_text(body)
}

#[tokio::test]
async fn the_spot_wizard_runs_from_link_to_review_across_a_restart() {
    let model = script(vec![
        (
            "help me add a spot",
            vec![
                Move::Tool("start_flow", |_| json!({"flow": "spot_wizard"})),
                Move::Text("yesss! send me the maps link"),
            ],
        ),
        (
            "google.com/maps",
            vec![
                Move::Tool(
                    "set_flow_slots",
                    |_| json!({"slots": {"maps_url": "https://www.google.com/maps/place/Hollow+Bowl/@45.5231,-122.6765,17z"}}),
                ),
                Move::Text("got it! what's it called and what's there?"),
            ],
        ),
        (
            "Hollow Bowl",
            vec![
                Move::Tool(
                    "set_flow_slots",
                    |_| json!({"slots": {"name": "Hollow Bowl", "spot_type": "diy", "features": "a deep bowl"}}),
                ),
                Move::Tool("create_spot_draft", |_| {
                    json!({"name": "Hollow Bowl", "type": "diy",
                           "mapsUrl": "https://www.google.com/maps/place/Hollow+Bowl/@45.5231,-122.6765,17z",
                           "description": "a deep bowl"})
                }),
                Move::Tool(
                    "set_flow_slots",
                    |b| json!({"slots": {"draft_id": last_result_id(b)}}),
                ),
                Move::Text("submitted! the mods will check it, i'll tell you when they do"),
            ],
        ),
    ]);
    let env = TestEnv::new(model).await;
    let worker = env.spawn_app().await;

    say(&env, "can you help me add a spot?").await;
    assert_eq!(
        step_status(&env).await,
        ("location".into(), "active".into())
    );
    // The next turn's prompt shows the flow, its step and what it needs.
    deliver_again(
        &env,
        "https://www.google.com/maps/place/Hollow+Bowl/@45.5231,-122.6765,17z",
    )
    .await;
    let prompt = system_prompt(env.stub.requests().last().unwrap());
    assert!(
        prompt.contains("Guided flow in progress: Add a spot to TrickBook"),
        "{prompt}"
    );
    assert_eq!(step_status(&env).await, ("details".into(), "active".into()));

    // A worker restart in the middle: the flow is where it was.
    worker.stop().await;
    let worker = env.spawn_app().await;
    deliver_again(&env, "it's called Hollow Bowl, a diy with a deep bowl").await;
    let (_, step, status, slots) = flow_of(&env).await.unwrap();
    assert_eq!((step.as_str(), status.as_str()), ("review", "waiting"));
    // The moderator approves: the follow-up comes, and the flow ends.
    let follow_up = approve_hollow_bowl(&env, &slots).await;
    assert!(follow_up.trigger.is_some());
    assert_eq!(step_status(&env).await, ("outcome".into(), "done".into()));
    let brief = env.stub.requests().last().map(|b| b.to_string()).unwrap();
    assert!(
        brief.contains("moves on the guided flow"),
        "the follow-up knows: {brief}"
    );
    worker.stop().await;
    env.finish().await;
}

/// The demo's `--spot-wizard`: the offline model plays the chat's own script through a real
/// worker, and the flow runs from the first line to the moderator's approval. The model is offered
/// only what the turn's words call for (no `set_flow_slots` before the flow starts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_model_runs_the_demos_spot_wizard_from_the_first_line_to_the_approval() {
    let model = companion_dev::stub::DemoModel::load(embedder(), &root().join("deploy/local/seed"))
        .await
        .expect("the demo data loads");
    let env = TestEnv::with_model(Arc::new(model).responder()).await;
    let worker = env.spawn_app().await;
    let mut said = Vec::new();
    for line in companion_dev::chat::SPOT_WIZARD_SCRIPT {
        let reply = say(&env, line).await.content;
        eprintln!("> {line}\n< {reply}");
        said.push(reply);
    }
    assert!(said[0].contains("maps link"), "{said:?}");
    assert!(said[1].contains("what's the spot called"), "{said:?}");
    assert!(
        said[2].contains("sent \"Hollow Bowl\" to the moderators"),
        "{said:?}"
    );
    let (flow, step, status, slots) = flow_of(&env).await.expect("the flow started");
    assert_eq!(
        (flow.as_str(), step.as_str(), status.as_str()),
        ("spot_wizard", "review", "waiting")
    );
    let follow_up = approve_hollow_bowl(&env, &slots).await;
    eprintln!("< {}", follow_up.content);
    assert!(
        follow_up.content.contains("Hollow Bowl"),
        "{}",
        follow_up.content
    );
    assert_eq!(step_status(&env).await, ("outcome".into(), "done".into()));
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn the_season_plan_branches_on_the_level_and_builds_a_real_tricklist() {
    let model = script(vec![
        (
            "plan my season",
            vec![
                Move::Tool("start_flow", |_| json!({"flow": "season_plan"})),
                Move::Text("let's go! what's your level?"),
            ],
        ),
        (
            "beginner",
            vec![
                Move::Tool(
                    "set_flow_slots",
                    |_| json!({"slots": {"sport": "snowboard", "level": "beginner", "days": 12}}),
                ),
                Move::Text("nice, for beginners i'd pick Mt Hood Meadows"),
            ],
        ),
        (
            "Meadows",
            vec![
                Move::Tool(
                    "set_flow_slots",
                    |_| json!({"slots": {"mountains": ["Mt Hood Meadows"]}}),
                ),
                Move::Tool(
                    "create_tricklist",
                    |_| json!({"name": "Season 1", "tricks": ["Butter", "Indy Grab"], "category": "snowboard"}),
                ),
                Move::Tool(
                    "set_flow_slots",
                    |b| json!({"slots": {"tricklist_id": last_result_id(b)}}),
                ),
                Move::Text("your season list is ready! when's the first trip?"),
            ],
        ),
        (
            "december 20",
            vec![
                Move::Tool(
                    "set_flow_slots",
                    |_| json!({"slots": {"first_trip": "2026-12-20"}}),
                ),
                Move::Text("plan done: Meadows, your list, Dec 20!"),
            ],
        ),
    ]);
    let env = TestEnv::new(model).await;
    let worker = env.spawn_app().await;
    deliver_again(&env, "can you plan my season?").await;
    assert_eq!(step_status(&env).await, ("assess".into(), "active".into()));
    worker.stop().await;
    let worker = env.spawn_app().await;
    deliver_again(&env, "snowboard, total beginner, maybe 12 days").await;
    assert_eq!(
        step_status(&env).await,
        ("mountains_beginner".into(), "active".into()),
        "the beginner branch"
    );
    deliver_again(&env, "Meadows sounds good").await;
    let (_, step, _, slots) = flow_of(&env).await.unwrap();
    assert_eq!(step, "trips");
    let list = ObjectId::parse_str(slots["tricklist_id"].as_str().unwrap()).unwrap();
    let stored = env
        .mongo
        .collection("tricklists")
        .find_one(doc! {"_id": list})
        .await
        .unwrap()
        .expect("the tricklist is real");
    assert_eq!(stored.get_str("name").unwrap(), "Season 1");
    deliver_again(&env, "december 20").await;
    assert_eq!(step_status(&env).await, ("wrap_up".into(), "done".into()));
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn trick_coaching_keeps_a_practice_list_and_checks_off_what_the_user_lands() {
    let model = script(vec![
        (
            "learn a kickflip",
            vec![
                Move::Tool("start_flow", |_| json!({"flow": "trick_coaching"})),
                Move::Tool(
                    "set_flow_slots",
                    |_| json!({"slots": {"goal_trick": "Kickflip", "sport": "skateboard", "can_do": ["Ollie"]}}),
                ),
                Move::Text("kickflips! want a practice list?"),
            ],
        ),
        (
            "make me the list",
            vec![
                Move::Tool(
                    "create_tricklist",
                    |_| json!({"name": "Kickflip path", "tricks": ["Ollie", "Kickflip"]}),
                ),
                Move::Tool(
                    "set_flow_slots",
                    |b| json!({"slots": {"tricklist_id": last_result_id(b)}}),
                ),
                Move::Text("here's your path: ollies first, then kickflips"),
            ],
        ),
        (
            "check in on me",
            vec![
                Move::Tool("schedule_reminder", |_| {
                    let at = chrono::Utc::now() + chrono::Duration::seconds(3);
                    json!({"text": "how did the session go?", "at": at.to_rfc3339()})
                }),
                Move::Tool(
                    "set_flow_slots",
                    |b| json!({"slots": {"reminder_id": last_result_field(b, "reminderId")}}),
                ),
                Move::Text("deal, go skate!"),
            ],
        ),
        (
            "landed my ollie",
            vec![
                Move::Tool(
                    "mark_trick_landed",
                    |b| json!({"trick": "ollie", "tricklistId": slot_in_prompt(b, "tricklist_id")}),
                ),
                Move::Text("checked off!! now flick it"),
            ],
        ),
        (
            "KICKFLIP",
            vec![
                Move::Tool(
                    "mark_trick_landed",
                    |b| json!({"trick": "kick-flip", "tricklistId": slot_in_prompt(b, "tricklist_id")}),
                ),
                Move::Tool(
                    "set_flow_slots",
                    |_| json!({"slots": {"landed_goal": true}}),
                ),
                Move::Text("LET'S GOOO"),
            ],
        ),
    ]);
    let env = TestEnv::with(model, |c| c.turn.reminder_min_lead_secs = 1).await;
    let worker = env.spawn_app().await;
    deliver_again(&env, "i want to learn a kickflip").await;
    assert_eq!(
        step_status(&env).await,
        ("practice_list".into(), "active".into())
    );
    deliver_again(&env, "yes make me the list").await;
    let (_, step, _, slots) = flow_of(&env).await.unwrap();
    assert_eq!(step, "check_in");
    let list = ObjectId::parse_str(slots["tricklist_id"].as_str().unwrap()).unwrap();
    let checked = |env: &TestEnv| {
        let mongo = env.mongo.clone();
        async move {
            let l = mongo
                .user_tricklists(oid(JESS), 50)
                .await
                .unwrap()
                .into_iter()
                .find(|l| l.id == list)
                .expect("the practice list");
            l.tricks
                .iter()
                .map(|t| (t.name.clone().unwrap_or_default(), t.checked))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        checked(&env).await,
        [("Ollie".to_owned(), false), ("Kickflip".to_owned(), false)]
    );

    // The check-in waits for the reminder; a worker restart meanwhile changes nothing. When it comes
    // due, the companion writes and the flow moves on to practice.
    let mut replies = env.completions(JESS_KAORI).await;
    deliver_again(&env, "sure, check in on me after my next session").await;
    assert_eq!(
        step_status(&env).await,
        ("check_in".into(), "waiting".into())
    );
    worker.stop().await;
    let worker = env.spawn_app().await;
    let check_in = next_proactive(&mut replies, Duration::from_secs(40)).await;
    assert_eq!(
        check_in.trigger.map(|t| t.kind).as_deref(),
        Some("reminder"),
        "the check-in reminder's message"
    );
    assert_eq!(
        step_status(&env).await,
        ("practice".into(), "active".into())
    );
    deliver_again(&env, "i landed my ollie today").await;
    assert_eq!(
        checked(&env).await,
        [("Ollie".to_owned(), true), ("Kickflip".to_owned(), false)]
    );
    assert_eq!(
        step_status(&env).await,
        ("practice".into(), "active".into())
    );
    deliver_again(&env, "KICKFLIP LANDED").await;
    assert_eq!(
        checked(&env).await,
        [("Ollie".to_owned(), true), ("Kickflip".to_owned(), true)]
    );
    assert_eq!(step_status(&env).await, ("celebrate".into(), "done".into()));
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_user_leaves_a_flow_and_an_idle_one_expires_with_one_mention() {
    let model = script(vec![
        (
            "coach me",
            vec![
                // The same call id in both starts: the second start is a change of its own.
                Move::SameId("start_flow", |_| json!({"flow": "trick_coaching"})),
                Move::Text("sure, which trick?"),
            ],
        ),
        (
            "stop",
            vec![
                Move::Tool("leave_flow", |_| json!({})),
                Move::Text("no worries"),
            ],
        ),
        (
            "pause",
            vec![
                Move::Tool("leave_flow", |_| json!({"pause": true})),
                Move::Text("paused"),
            ],
        ),
    ]);
    let env = TestEnv::new(model).await;
    let worker = env.spawn_app().await;
    say(&env, "coach me on a trick").await;
    say(&env, "actually stop, not today").await;
    assert_eq!(step_status(&env).await, ("assess".into(), "left".into()));
    say(&env, "what's up, got a plan for me?").await;
    let prompt = system_prompt(env.stub.requests().last().unwrap());
    assert!(prompt.contains("Guided flows you can offer"), "{prompt}");
    assert!(!prompt.contains("Guided flow in progress"));

    // Started again, paused, then untouched for 31 days: it expires at the next message, mentioned once.
    say(&env, "coach me after all").await;
    say(&env, "pause it please").await;
    assert_eq!(step_status(&env).await, ("assess".into(), "paused".into()));
    sqlx::query("UPDATE flow_states SET updated_at = now() - interval '31 days'")
        .execute(&env.pg.pool)
        .await
        .unwrap();
    say(&env, "hey again").await;
    let prompt = system_prompt(env.stub.requests().last().unwrap());
    assert!(prompt.contains("An unfinished flow"), "{prompt}");
    assert!(prompt.contains("Learn a trick"), "{prompt}");
    assert_eq!(step_status(&env).await, ("assess".into(), "expired".into()));
    say(&env, "how are you").await;
    let prompt = system_prompt(env.stub.requests().last().unwrap());
    assert!(!prompt.contains("An unfinished flow"), "mentioned once");
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn invalid_flow_files_stop_the_worker_with_a_clear_error() {
    let env = TestEnv::new(Arc::new(|_: &Value| StubReply::text("hi"))).await;
    let cases = [
        (
            json!({"id": "bad", "title": "B", "offer": "o", "start": "a",
                   "steps": {"a": {"goal": "g", "tools": ["teleport"]}}}),
            "step `a` uses unknown tool `teleport`",
        ),
        (
            json!({"id": "bad", "title": "B", "offer": "o", "start": "a",
                   "steps": {"a": {"goal": "g"}, "b": {"goal": "g"}}}),
            "step `b` is unreachable from `a`",
        ),
        (
            json!({"id": "bad", "title": "B", "offer": "o", "start": "a",
                   "steps": {"a": {"goal": "g", "slots": {"x": {"description": "no type"}}}}}),
            "missing field `type`",
        ),
    ];
    for (flow, want) in cases {
        let dir = std::env::temp_dir().join(format!("flows-{:016x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["season_plan", "spot_wizard", "trick_coaching"] {
            std::fs::copy(
                root().join(format!("flows/{f}.json")),
                dir.join(format!("{f}.json")),
            )
            .unwrap();
        }
        std::fs::write(dir.join("bad.json"), flow.to_string()).unwrap();
        let mut cmd = tokio::process::Command::from(env.command(&["worker"]));
        cmd.env("COMPANION_FLOWS_DIR", &dir);
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
            .await
            .expect("the worker exits")
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "refused: {err}");
        assert!(
            err.contains("bad.json") && err.contains(want),
            "{want} in: {err}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
    env.finish().await;
}

/// A reminder row of Jess's with Kaori, due now, and Jess's coaching flow waiting for it.
async fn flow_waiting_on_a_reminder(env: &TestEnv) -> String {
    let id = env.due_reminder("how did the session go?").await;
    let slots = json!({"goal_trick": "Kickflip", "sport": "skateboard",
                       "tricklist_id": ObjectId::new().to_hex(), "reminder_id": id});
    sqlx::query(
        "INSERT INTO flow_states (user_id, bot_id, flow, step, slots, status, waiting_for)
         VALUES ($1, $2, 'trick_coaching', 'check_in', $3, 'waiting', $4)
         ON CONFLICT (user_id, bot_id) DO UPDATE SET flow = EXCLUDED.flow, step = EXCLUDED.step,
            slots = EXCLUDED.slots, status = EXCLUDED.status, waiting_for = EXCLUDED.waiting_for",
    )
    .bind(JESS)
    .bind(KAORI)
    .bind(slots)
    .bind(format!("reminder:{id}"))
    .execute(&env.pg.pool)
    .await
    .unwrap();
    id
}

/// The schedule of reminder `id` fires; how its job ended: (state, reason).
async fn fire_reminder(env: &TestEnv, id: &str) -> (String, Option<String>) {
    let j = env.fire_reminder(id).await;
    (j.state.as_str().to_owned(), j.reason)
}

/// (step, status, waiting_for) of Jess's flow with Kaori.
async fn where_the_flow_stands(env: &TestEnv) -> (String, String, Option<String>) {
    sqlx::query_as(
        "SELECT step, status, waiting_for FROM flow_states WHERE user_id = $1 AND bot_id = $2",
    )
    .bind(JESS)
    .bind(KAORI)
    .fetch_one(&env.pg.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_reminder_dropped_over_the_cap_or_for_a_block_leaves_the_flow_waiting_where_it_was() {
    let env = TestEnv::with(
        companion_dev::stub::always(StubReply::text("yo, how'd it go?")),
        |c| {
            c.follow_ups.daily_cap = 1;
        },
    )
    .await;
    let worker = env.spawn_app().await;

    // The day's one follow-up goes to another reminder; the flow's own is then over the cap.
    let other = env.due_reminder("wax the board").await;
    assert_eq!(fire_reminder(&env, &other).await.0, "done");
    let capped = flow_waiting_on_a_reminder(&env).await;
    let before = where_the_flow_stands(&env).await;
    let (state, reason) = fire_reminder(&env, &capped).await;
    assert_eq!(state, "dropped");
    assert!(reason.unwrap().contains("daily cap of 1"));
    assert_eq!(
        where_the_flow_stands(&env).await,
        before,
        "over the cap: still waiting"
    );

    // A new day's allowance, but Jess blocked Kaori.
    sqlx::query("DELETE FROM job_steps WHERE tally LIKE 'proactive:%'")
        .execute(&env.pg.pool)
        .await
        .unwrap();
    env.mongo
        .collection("users")
        .update_one(
            doc! { "_id": oid(JESS) },
            doc! { "$set": { "blockedUsers": [oid(KAORI)] } },
        )
        .await
        .unwrap();
    let blocked = flow_waiting_on_a_reminder(&env).await;
    let before = where_the_flow_stands(&env).await;
    let (state, reason) = fire_reminder(&env, &blocked).await;
    assert_eq!(state, "dropped");
    assert!(reason.unwrap().contains("blocked"));
    assert_eq!(
        where_the_flow_stands(&env).await,
        before,
        "blocked: still waiting"
    );

    // Unblocked, the next one is sent and moves the flow on: the check above could have failed.
    env.mongo
        .collection("users")
        .update_one(
            doc! { "_id": oid(JESS) },
            doc! { "$set": { "blockedUsers": [] } },
        )
        .await
        .unwrap();
    let sent = flow_waiting_on_a_reminder(&env).await;
    assert_eq!(fire_reminder(&env, &sent).await.0, "done");
    assert_eq!(
        where_the_flow_stands(&env).await,
        ("practice".into(), "active".into(), None)
    );
    worker.stop().await;
    env.finish().await;
}

/// A slot value the step's schema refuses comes back to the model as an error result naming the slot
/// (`slots.spot_type`) and what it must be; nothing is recorded, and the next call with a valid value
/// moves the flow on.
#[tokio::test]
async fn a_slot_value_the_step_refuses_is_an_error_the_model_reads_and_the_flow_stays() {
    let model = script(vec![
        (
            "help me add a spot",
            vec![
                Move::Tool("start_flow", |_| json!({"flow": "spot_wizard"})),
                Move::Tool(
                    "set_flow_slots",
                    |_| json!({"slots": {"maps_url": "45.5231,-122.6765"}}),
                ),
                Move::Text("what's it called?"),
            ],
        ),
        (
            "Hollow Bowl",
            vec![
                Move::Tool(
                    "set_flow_slots",
                    |_| json!({"slots": {"name": "Hollow Bowl", "spot_type": "mall"}}),
                ),
                Move::Tool(
                    "set_flow_slots",
                    |_| json!({"slots": {"name": "Hollow Bowl", "spot_type": "diy"}}),
                ),
                Move::Text("ok!"),
            ],
        ),
    ]);
    let env = TestEnv::new(model).await;
    let worker = env.spawn_app().await;
    say(&env, "help me add a spot").await;
    assert_eq!(step_status(&env).await, ("details".into(), "active".into()));
    say(&env, "Hollow Bowl, a diy").await;

    let requests = env.stub.requests();
    let results: Vec<Value> = requests
        .last()
        .and_then(|b| b["messages"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .rev()
        .take_while(|m| m["role"] != "user")
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            serde_json::from_str(m["content"].as_str().unwrap_or("null")).unwrap_or(Value::Null)
        })
        .collect();
    // Newest first: the valid call's result, then the refusal.
    assert_eq!(results.len(), 2, "{results:?}");
    let refused = &results[1];
    assert_eq!(refused["field"], "slots.spot_type", "{refused}");
    let error = refused["error"].as_str().unwrap_or_default();
    assert!(error.contains("must be one of"), "{error}");
    assert!(error.contains("\"diy\""), "{error}");
    assert!(results[0].get("error").is_none(), "{:?}", results[0]);
    let (_, step, _, slots) = flow_of(&env).await.unwrap();
    assert_eq!(slots["spot_type"], "diy", "{slots}");
    assert_eq!(step, "draft");
    worker.stop().await;
}
