//! The offline demo model with the embedding model at hand: a newcomer's own phrasing gets a sensible
//! scripted answer through a real turn (it names the seeded trick or city), and it stays labelled as
//! scripted.

use std::sync::Arc;

use companion_dev::stub::DemoModel;

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
    let mut env = TestEnv::with_model(Arc::new(model).responder()).await;
    env.start_worker().await;

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
    let mut env = TestEnv::with_model(Arc::new(model).responder()).await;
    env.start_worker().await;

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
