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
