//! The prompt budget: a turn is offered the tools its message needs (every tool stays reachable, by the
//! offer or by `more_tools`), flows only when asked for, and every block of the prompt within its cap.

use std::sync::Arc;

use companion_dev::stub::{Responder, StubReply, last_user_text};
use serde_json::{Value, json};

use crate::env::*;

/// The names of the tools a request offered.
/// The tools a request offers, but the crisis flag, which goes with every offer (checked here).
fn offered(body: &Value) -> Vec<String> {
    let names: Vec<String> = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect();
    assert!(
        names.is_empty() || names.iter().any(|n| n == "flag_concern"),
        "the crisis flag goes with every offer: {names:?}"
    );
    names.into_iter().filter(|n| n != "flag_concern").collect()
}

/// Starts a trick-coaching flow when asked to coach, asks for the reminders group when told to "buzz"
/// (words the offer does not read), answers everything else with text.
fn model() -> Responder {
    Arc::new(|body: &Value| {
        let user = last_user_text(body);
        let answered = last_message(body)["role"] == "tool";
        match (user.as_str(), answered) {
            (_, true) => StubReply::text("done!"),
            (u, false) if u.contains("coach me") => {
                StubReply::tool("start_flow", json!({"flow": "trick_coaching"}))
            }
            (u, false) if u.contains("buzz") => {
                StubReply::tool("more_tools", json!({"group": "reminders"}))
            }
            _ => StubReply::text("ok!"),
        }
    })
}

#[tokio::test]
async fn every_tool_is_offered_for_a_message_that_needs_it() {
    let env = TestEnv::with(model(), |c| c.turn.user_turns_per_minute = 0).await;
    env.spawn_app().await;
    // Each tool, a message a user would send for it.
    let cases: [(&str, &str); 17] = [
        ("search_spots", "any good skateparks near portland?"),
        ("get_user_tricklists", "what's on my tricklists?"),
        ("search_trickipedia", "what even is a heelflip"),
        (
            "create_tricklist",
            "make me a list with kickflip and heelflip",
        ),
        (
            "create_spot_draft",
            "add this one pls https://maps.app.goo.gl/abc123",
        ),
        ("share_content", "send me the card for that bowl"),
        (
            "schedule_reminder",
            "remind me to wax my board before saturday",
        ),
        ("schedule_reminder", "recuérdame encerar la tabla mañana"),
        ("cancel_reminder", "cancel my reminder"),
        ("mark_trick_landed", "I FINALLY landed my first kickflip!!"),
        ("start_flow", "can you help me plan my season?"),
        ("search_trickipedia", "トリックを教えて"),
        ("search_spots", "¿dónde hay un buen skatepark?"),
        ("remember", "remember that i ride goofy"),
        ("forget", "forget what i said about my wrist"),
        ("remember", "覚えておいて、グーフィーだよ"),
        ("more_tools", "hey how's it going"),
    ];
    for (tool, text) in cases {
        let before = env.stub.requests().len();
        let e = env.dm(JESS, KAORI, JESS_KAORI, text).await;
        env.turn(&e).await;
        let first = &env.stub.requests()[before];
        let names = offered(first);
        println!("{text:?} → {names:?}");
        assert!(
            names.iter().any(|n| n == tool),
            "{tool} offered for {text:?}: {names:?}"
        );
    }
    // Small talk keeps the offer of the conversation's last ask (the memory group, asked for in
    // Japanese just before), so the turn before's prefix is served from a provider's cache; small talk
    // with no ask before it is offered `more_tools` alone
    // (`small_talk_keeps_the_offer_of_the_last_ask_and_a_new_ask_changes_it`).
    let last = env.stub.requests().last().cloned().unwrap();
    assert_eq!(offered(&last), ["remember", "forget", "more_tools"]);

    // Inside a flow, its tools are there whatever the message says.
    let e = env.dm(JESS, KAORI, JESS_KAORI, "coach me on a trick").await;
    env.turn(&e).await;
    let before = env.stub.requests().len();
    let e = env.dm(JESS, KAORI, JESS_KAORI, "hmm not sure").await;
    env.turn(&e).await;
    let names = offered(&env.stub.requests()[before]);
    for tool in ["set_flow_slots", "leave_flow"] {
        assert!(
            names.iter().any(|n| n == tool),
            "{tool} in a flow: {names:?}"
        );
    }
}

#[tokio::test]
async fn a_group_the_offer_missed_is_one_more_tools_call_away() {
    let env = TestEnv::new(model()).await;
    env.spawn_app().await;
    let e = env.dm(JESS, KAORI, JESS_KAORI, "buzz me on the 3rd").await;
    let done = env.turn(&e).await;
    let requests = env.stub.requests();
    assert_eq!(requests.len(), 2, "the ask, then the answer with the group");
    assert!(!offered(&requests[0]).contains(&"schedule_reminder".to_owned()));
    assert!(
        offered(&requests[1]).contains(&"schedule_reminder".to_owned()),
        "{:?}",
        offered(&requests[1])
    );
    assert_eq!(done.content, "done!");
    // The model reads what it was given.
    assert_eq!(
        last_tool_result(&env.stub)["tools"],
        json!(["schedule_reminder", "cancel_reminder"])
    );
}

#[tokio::test]
async fn flows_are_on_offer_only_when_the_message_asks_for_one() {
    let env = TestEnv::new(model()).await;
    env.spawn_app().await;
    for (text, offered) in [("yo", false), ("help me plan my season", true)] {
        let e = env.dm(JESS, KAORI, JESS_KAORI, text).await;
        env.turn(&e).await;
        let system = system_text(env.stub.requests().last().unwrap());
        assert_eq!(
            system.contains("Guided flows you can offer"),
            offered,
            "{text}: {system}"
        );
    }
}

#[tokio::test]
async fn every_block_stays_within_its_cap_and_the_history_within_the_total() {
    let env = TestEnv::with(model(), |c| {
        c.prompt.user_tokens = 60;
        c.prompt.history_tokens = 120;
    })
    .await;
    // A bio far over the user block's cap, and long earlier messages.
    let long_bio = "i skate every day and ".repeat(40);
    env.mongo
        .collection("users")
        .update_one(
            bson::doc! {"_id": bson::oid::ObjectId::parse_str(JESS).unwrap()},
            bson::doc! {"$set": {"bio": &long_bio}},
        )
        .await
        .unwrap();
    env.earlier_messages(10, |i| {
        format!("history message {i} {}", "and on and on ".repeat(10))
    })
    .await;
    env.spawn_app().await;
    let e = env.dm(JESS, KAORI, JESS_KAORI, "what's up").await;
    env.turn(&e).await;
    let body = env.stub.requests().last().cloned().unwrap();
    let system = body["messages"][0]["content"].as_str().unwrap().to_owned();
    let user_block = &system[system.find("## The user").unwrap()..];
    assert!(
        user_block.len() <= 60 * 4,
        "the user block within 60 tokens: {} bytes\n{user_block}",
        user_block.len()
    );
    assert!(user_block.contains("(…)"), "a cut block says so");
    let history: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .skip(1)
        .filter(|m| m["role"] != "system")
        .filter_map(|m| m["content"].as_str())
        .filter(|c| c.starts_with("history message"))
        .collect();
    // Each is ~150 bytes (~38 tokens): three fit 120 tokens, and they are the newest.
    assert!(
        !history.is_empty() && history.len() <= 3,
        "{}",
        history.len()
    );
    assert!(history.last().unwrap().starts_with("history message 9"));
}

#[tokio::test]
async fn with_tools_by_turn_off_every_turn_is_offered_every_tool() {
    let env = TestEnv::with(model(), |c| c.prompt.tools_by_turn = false).await;
    env.spawn_app().await;
    let e = env.dm(JESS, KAORI, JESS_KAORI, "hey how's it going").await;
    env.turn(&e).await;
    let names = offered(env.stub.requests().last().unwrap());
    assert_eq!(names.len(), 14, "{names:?}");
    assert!(!names.contains(&"more_tools".to_owned()));
}

/// Cached prompt tokens of 16 turns of one conversation with 30 messages of history (more than the
/// window holds), under a simulated provider cache, and the turns whose history began elsewhere than
/// the turn before's.
async fn cached_over_turns(history_step: usize) -> (u64, usize) {
    let env = TestEnv::with(model(), |c| {
        c.turn.user_turns_per_minute = 0;
        c.prompt.history_step = history_step;
    })
    .await;
    env.stub.simulate_prompt_cache();
    env.earlier_messages(30, |i| {
        format!(
            "history message {i}: {}",
            "we talked about pushing and stance and ".repeat(3)
        )
    })
    .await;
    env.spawn_app().await;
    let mut firsts = Vec::new();
    for i in 0..16 {
        let text = format!("ok and which trick should I learn after number {i}?");
        let e = env.dm(JESS, KAORI, JESS_KAORI, &text).await;
        env.turn(&e).await;
        let body = env.stub.requests().last().cloned().unwrap();
        firsts.push(body["messages"][1]["content"].to_string());
    }
    let moves = firsts.windows(2).filter(|w| w[0] != w[1]).count();
    (env.stub.totals().cached_tokens, moves)
}

#[tokio::test]
async fn a_conversations_turns_share_their_history_so_the_provider_cache_serves_it() {
    let (anchored, anchored_moves) = cached_over_turns(8).await;
    let (sliding, sliding_moves) = cached_over_turns(1).await;
    assert_eq!(sliding_moves, 15, "a sliding window moves every turn");
    assert!(
        anchored_moves < sliding_moves,
        "anchored moved on {anchored_moves} of 15 turns"
    );
    // The tools and the system prompt are served in both; the history only when it is anchored
    // (a 128-token block or more on each turn it stayed).
    assert!(
        anchored >= sliding + 4 * 128,
        "cached tokens anchored {anchored}, sliding {sliding}"
    );
}

#[tokio::test]
async fn small_talk_keeps_the_offer_of_the_last_ask_and_a_new_ask_changes_it() {
    let env = TestEnv::with(model(), |c| c.turn.user_turns_per_minute = 0).await;
    env.spawn_app().await;
    let mut offers = Vec::new();
    for text in [
        "hey whats up",
        "how do i land a heelflip",
        "lol ok",
        "thanks!!",
        "any good skateparks near portland?",
        "sick",
    ] {
        let e = env.dm(JESS, KAORI, JESS_KAORI, text).await;
        env.turn(&e).await;
        offers.push(offered(env.stub.requests().last().unwrap()));
    }
    assert_eq!(
        offers[0],
        ["more_tools"],
        "small talk with no ask before it"
    );
    assert!(offers[1].contains(&"search_trickipedia".to_owned()));
    assert_eq!(
        offers[2], offers[1],
        "small talk keeps the last ask's offer"
    );
    assert_eq!(offers[3], offers[1]);
    assert!(offers[4].contains(&"search_spots".to_owned()));
    assert_ne!(offers[4], offers[1]);
    assert_eq!(offers[5], offers[4]);
}
