//! The operations endpoint of a running worker: `/healthz`, `/readyz` and `/metrics` counting a real turn
//! (the GenAI client histograms among them).

use crate::env::*;
use companion::testing::startup::App;
use companion_dev::stub::{StubReply, always};

#[tokio::test]
async fn health_readiness_and_metrics_reflect_a_real_turn() {
    let env = TestEnv::new(always(StubReply::text("metrics!"))).await;
    let worker = env.spawn_app().await;
    let base = &worker.base;
    let http = reqwest::Client::new();
    let health = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let body = ready.text().await.unwrap();
    assert!(
        body.contains("nats ok") && body.contains("mongodb ok") && body.contains("postgres ok"),
        "{body}"
    );

    let event = env.dm(JESS, KAORI, JESS_KAORI, "count me").await;
    env.turn(&event).await;
    let subject = env.bus.names.inbound(KAORI, JESS_KAORI);
    env.publish_raw(subject, "junk", "not json").await;
    assert!(
        eventually(std::time::Duration::from_secs(10), || async {
            env.dead_letters().await.len() == 1
        })
        .await
    );

    let metrics = worker.metrics().await;
    assert!(
        metrics.contains("companion_turns_total{outcome=\"answered\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("companion_dead_letters_total 1"),
        "{metrics}"
    );
    let model = &env.config.llm.model;
    assert!(
        metrics.contains(&format!(
            "companion_llm_requests_total{{model=\"{model}\",status=\"ok\"}} 1"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("companion_llm_tokens_total{"), "{metrics}");
    // The GenAI client histograms, in Prometheus form, for the one model call.
    let call = format!(
        "gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"openai\",gen_ai_request_model=\"{model}\",gen_ai_response_model=\"{model}\""
    );
    for series in [
        format!("gen_ai_client_operation_duration_seconds_count{{{call}}} 1"),
        format!("gen_ai_client_token_usage_count{{{call},gen_ai_token_type=\"input\"}} 1"),
        format!("gen_ai_client_token_usage_count{{{call},gen_ai_token_type=\"output\"}} 1"),
    ] {
        assert!(metrics.contains(&series), "{series} in\n{metrics}");
    }
    assert!(
        metrics.contains("companion_turn_seconds_count 1"),
        "{metrics}"
    );

    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn metrics_show_the_consumers_pending_and_unacked_events() {
    use futures::StreamExt;
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    // The endpoint as a worker binds it, with no worker pulling: the consumer's counts are the test's.
    let bound = App::build(&env.config)
        .await
        .expect("the app builds")
        .bind()
        .await;
    let consumer = bound
        .app
        .bus
        .consumer(companion_store::bus::Feed::Inbound, &env.config.consumer)
        .await
        .unwrap()
        .consumer;
    let addr = bound.ops_addr().expect("the endpoint listens");
    let url = format!("http://{addr}/metrics");
    let labels = format!(
        "stream=\"{}\",consumer=\"{}\"",
        env.bus.names.stream_in, env.config.consumer.name
    );
    let shows = |pending: u64, ack_pending: u64| {
        let url = url.clone();
        let want = [
            format!("companion_consumer_pending{{{labels}}} {pending}\n"),
            format!("companion_consumer_ack_pending{{{labels}}} {ack_pending}\n"),
        ];
        async move {
            let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
            want.iter().all(|w| text.contains(w.as_str()))
        }
    };
    let within = std::time::Duration::from_secs(10);
    assert!(eventually(within, || shows(0, 0)).await);

    for text in ["one", "two"] {
        let event = env.dm(JESS, KAORI, JESS_KAORI, text).await;
        env.publish(&event).await;
    }
    assert!(eventually(within, || shows(2, 0)).await, "two waiting");

    // Take one without acking it, as a worker mid-turn would.
    let mut batch = consumer.fetch().max_messages(1).messages().await.unwrap();
    let taken = batch.next().await.unwrap().unwrap();
    assert!(
        eventually(within, || shows(1, 1)).await,
        "one waiting, one unacked"
    );
    taken.ack().await.unwrap();
    assert!(eventually(within, || shows(1, 0)).await, "acked");
    drop(bound);
    env.finish().await;
}
