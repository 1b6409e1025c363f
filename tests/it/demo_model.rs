//! The offline demo model with the embedding model at hand: a newcomer's own phrasing gets a sensible
//! scripted answer through a real turn (it names the seeded trick or city), and it stays labelled as
//! scripted.

use std::{sync::Arc, time::Duration};

use companion_dev::stub::DemoModel;
use companion_store::bus::event::Completion;
use futures::{StreamExt, TryStreamExt};

use crate::env::*;

async fn ask(env: &TestEnv, text: &str) -> String {
    let event = env.dm(JESS, KAORI, JESS_KAORI, text).await;
    let answer = env.turn(&event).await.content;
    eprintln!("> {text}\n< {answer}");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn natural_questions_get_sensible_scripted_answers() {
    let model = DemoModel::load(embedder(), &root().join("deploy/local/seed"))
        .await
        .expect("the demo data loads");
    let env = TestEnv::with_model(Arc::new(model).responder()).await;
    env.spawn_app().await;

    // Phrasings that are not among the model's intent examples.
    let ollie = ask(&env, "any tips on how to ollie??").await;
    assert!(ollie.starts_with("[scripted]"), "{ollie}");
    assert!(ollie.contains("trickipedia has: Ollie"), "{ollie}");

    // No trick named: the closest beginner trick of the sport the message names.
    let first = ask(&env, "what should i learn first on my skateboard").await;
    let beginner_skate = [
        "Ollie",
        "Pop Shove-it",
        "Frontside 180",
        "Backside 180",
        "Manual",
        "Drop In",
        "Rock to Fakie",
        "Axle Stall",
        "50-50 Grind",
    ];
    // The best match is named first (others whose description mentions it may follow).
    let named = first
        .strip_prefix("[scripted] trickipedia has: ")
        .and_then(|rest| rest.split(", ").next());
    assert!(
        named.is_some_and(|n| beginner_skate.contains(&n)),
        "a beginner skateboard trick: {first}"
    );

    let spots = ask(&env, "heading to portland next week, where should i ride").await;
    assert!(spots.contains("Burnside"), "{spots}");
    let chat = ask(&env, "thank you so much, that helps").await;
    assert!(chat.starts_with("[scripted Kaori]"), "{chat}");
    // Three earlier questions and three answers (tool calls and results are not messages).
    assert!(chat.contains("i remember 6 earlier messages"), "{chat}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_model_keeps_what_a_newcomer_tries_first() {
    let model = DemoModel::load(embedder(), &root().join("deploy/local/seed"))
        .await
        .expect("the demo data loads");
    let env = TestEnv::with_model(Arc::new(model).responder()).await;
    env.spawn_app().await;

    let list = ask(&env, "can you make me a list of 3 beginner tricks").await;
    assert!(list.contains("is saved"), "{list}");
    let made = env
        .mongo
        .user_tricklists(oid(JESS), 50)
        .await
        .unwrap()
        .into_iter()
        .find(|l| l.name == "Beginner Tricks")
        .expect("the list");
    assert_eq!(made.tricks.len(), 3, "three tricks");

    let before = chrono::Utc::now();
    let remind = ask(&env, "remind me in 2 minutes to wax my board").await;
    assert!(!remind.contains("didn't work"), "{remind}");
    let (text, fire_at): (String, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT text, fire_at FROM reminders WHERE user_id = $1")
            .bind(JESS)
            .fetch_one(&env.pg.pool)
            .await
            .unwrap();
    assert_eq!(text, "wax my board");
    let lead = (fire_at - before).num_seconds();
    assert!((100..=140).contains(&lead), "two minutes ahead: {lead} s");

    let denver = ask(&env, "any parks near denver?").await;
    assert!(
        denver.contains("don't know any spots in denver"),
        "{denver}"
    );
    env.finish().await;
}

/// The demo's seed documents of `file` (`tricks.json`, `ck_spots.json`).
fn seed(file: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(root().join("deploy/local/seed").join(file)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// `(bot user id, sport)` of every companion in `characters/`.
fn companions() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root().join("characters")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let c: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let id = c["botUserId"].as_str().unwrap().to_owned();
            out.push((id, c["sport"].as_str().unwrap().to_owned()));
        }
    }
    assert_eq!(out.len(), 5, "the five companions");
    out
}

async fn load_model() -> Arc<DemoModel> {
    Arc::new(
        DemoModel::load(embedder(), &root().join("deploy/local/seed"))
            .await
            .expect("the demo data loads"),
    )
}

/// A new user asks `bot` in a new DM (each its own user: the flood limit counts per user).
async fn ask_bot(env: &TestEnv, bot: &str, text: &str) -> String {
    let (user, conversation) = env.new_conversations(bot, 1).await.remove(0);
    let event = env.dm(&user, bot, &conversation, text).await;
    let answer = env.turn(&event).await.content;
    eprintln!("> {bot}: {text}\n< {answer}");
    answer
}

/// A companion suggests tricks of its own sport when the user names none (Kaori, a snowboarder,
/// suggested a surf trick), and the sport the user names when they name one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_companion_suggests_tricks_of_its_own_sport_unless_the_user_names_one() {
    let env = TestEnv::with_model(load_model().await.responder()).await;
    env.spawn_app().await;
    let tricks = seed("tricks.json");
    let of = |sport: &str| -> Vec<String> {
        tricks
            .iter()
            .filter(|t| t["category"] == sport)
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect()
    };
    let named = |answer: &str| -> Vec<String> {
        answer
            .strip_prefix("[scripted] trickipedia has: ")
            .unwrap_or_else(|| panic!("a trickipedia answer: {answer}"))
            .split(", ")
            .map(str::to_owned)
            .collect()
    };
    let mut asked = Vec::new();
    for (bot, sport) in companions() {
        for question in [
            "what trick should i learn next?",
            "what's a good first trick?",
        ] {
            asked.push((bot.clone(), sport.clone(), question));
        }
    }
    // The user names a sport: that sport's tricks, whoever answers.
    asked.push((
        KAORI.to_owned(),
        "skateboard".to_owned(),
        "what's a good first trick on a skateboard?",
    ));
    let mut wrong = Vec::new();
    for (bot, sport, question) in asked {
        let answer = ask_bot(&env, &bot, question).await;
        let own = of(&sport);
        if named(&answer).iter().any(|trick| !own.contains(trick)) {
            wrong.push(format!("{sport}: {question} -> {answer}"));
        }
    }
    assert!(wrong.is_empty(), "tricks of another sport: {wrong:#?}");
    env.finish().await;
}

/// A spot shared by its maps link outside the spot wizard is saved under the name the link gives
/// (it was saved as "New Spot"), unless the user calls it something.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_shared_by_its_link_keeps_the_name_the_link_or_the_user_gives() {
    let env = TestEnv::with_model(load_model().await.responder()).await;
    env.spawn_app().await;
    let cases = [
        (
            "can you add this spot? https://www.google.com/maps/place/Hollow+Bowl/@45.5,-122.6,17z",
            "Hollow Bowl",
        ),
        (
            "add this spot pls https://maps.apple.com/place?coordinate=45.51,-122.66&name=Lower%20Lot%20DIY",
            "Lower Lot DIY",
        ),
        (
            "add this spot, it's called The Pit https://www.google.com/maps/place/Hollow+Bowl/@45.5,-122.6,17z",
            "The Pit",
        ),
    ];
    for (text, name) in cases {
        let answer = ask(&env, text).await;
        assert!(answer.contains(&format!("\"{name}\"")), "{name}: {answer}");
    }
    let drafts: Vec<bson::Document> = env
        .mongo
        .collection("spot_drafts")
        .find(bson::doc! {"submittedBy": JESS})
        .sort(bson::doc! {"createdAt": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let names: Vec<&str> = drafts.iter().map(|d| d.get_str("name").unwrap()).collect();
    assert_eq!(names, cases.map(|(_, name)| name));
    env.finish().await;
}

/// In a group, two companions asked the same thing each say something of their own: their own sport's
/// spots, not the same list twice (both posted the same park list).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_group_each_companion_answers_with_spots_of_its_own_sport() {
    let env = TestEnv::with_model(load_model().await.responder()).await;
    env.spawn_app().await;
    // Each seeded spot's name and whether it is a snow spot (a mountain, a resort, a snow park).
    let spots: Vec<(String, bool)> = seed("ck_spots.json")
        .iter()
        .map(|s| {
            let snow = ["snow", "mountain", "resort"].contains(&s["type"].as_str().unwrap());
            (s["name"].as_str().unwrap().to_owned(), snow)
        })
        .collect();
    // The spots a message names, in its text or its card, whether they are snow spots.
    let named = |c: &Completion| -> Vec<(String, bool)> {
        let card = c
            .rich_content
            .as_ref()
            .filter(|r| r["type"] == "spots_list");
        let card = card.map(|r| r["data"].to_string()).unwrap_or_default();
        spots
            .iter()
            .filter(|(name, _)| c.content.contains(name.as_str()) || card.contains(name.as_str()))
            .cloned()
            .collect()
    };
    for text in [
        "kaori and tony: any parks in portland?",
        // The group demo's last line.
        "kaori and tony: park or street first?",
    ] {
        let mut out = env.all_completions().await;
        let e = env.group_message(&[KAORI, TONY], text).await;
        let mut got: Vec<Completion> = Vec::new();
        while got.len() < 2 {
            let c = tokio::time::timeout(Duration::from_secs(40), out.next())
                .await
                .unwrap_or_else(|_| panic!("two answers to {text}: {got:?}"))
                .expect("completions stream open");
            if c.responds_to.as_deref() == Some(e.message_id.as_str())
                && !got.iter().any(|g| g.message_id == c.message_id)
            {
                eprintln!("> {text}\n< {}: {}", c.sender_id, c.content);
                got.push(c);
            }
        }
        for c in &got {
            let spots = named(c);
            assert!(!spots.is_empty(), "spots named: {}", c.content);
            // Kaori snowboards, Tony skates.
            let snow = c.sender_id == KAORI;
            assert!(
                spots.iter().all(|(_, s)| *s == snow),
                "{}: {spots:?} in {}",
                c.sender_id,
                c.content
            );
        }
        assert_ne!(got[0].content, got[1].content, "{text}");
    }
    env.finish().await;
}
