//! Companions that follow up: a spot draft a companion made is reviewed, TB-Backend publishes the review
//! on `<prefix>.signal.spot_draft.<draftId>`, and the companion tells the user in the thread the draft came
//! from, once, whatever is redelivered, republished or killed on the way.

use std::{sync::Arc, time::Duration};

use bson::{Document, doc, oid::ObjectId};
use companion_dev::stub::{Responder, StubReply};
use companion_store::bus::event::Completion;
use futures::StreamExt;
use serde_json::{Value, json};
use sqlx::Connection;

use crate::env::*;

const MAPS: &str = "https://www.google.com/maps/place/Hollow+Bowl/@45.5231,-122.6765,17z";

/// The model: a DM asking to add a spot calls `create_spot_draft`; a follow-up brief (a system note
/// last) is answered by `follow_up`; anything else gets a short text.
pub(crate) fn model(follow_up: impl Fn(&str) -> StubReply + Send + Sync + 'static) -> Responder {
    Arc::new(move |body: &Value| {
        let last = last_message(body);
        let text = last["content"].as_str().unwrap_or_default();
        match last["role"].as_str() {
            Some("user") if text.contains("add this spot") => StubReply::tool(
                "create_spot_draft",
                json!({"name": "Hollow Bowl", "type": "skatepark", "mapsUrl": MAPS, "city": "Portland"}),
            ),
            Some("system") => follow_up(text),
            _ => StubReply::text("sent it to the mods 🛹"),
        }
    })
}

/// A DM turn in which Kaori submits a spot draft for Jess; the draft's id.
pub(crate) async fn submit_draft(env: &TestEnv) -> ObjectId {
    let event = env
        .dm(JESS, KAORI, JESS_KAORI, &format!("add this spot {MAPS}"))
        .await;
    let reply = env.turn(&event).await;
    let journal = env.journal();
    assert!(
        eventually(Duration::from_secs(10), || async {
            journal
                .get(&event.message_id)
                .await
                .unwrap()
                .is_some_and(|j| j.state == companion_journal::State::Done)
        })
        .await,
        "the turn settled"
    );
    assert_eq!(
        reply.rich_content.as_ref().unwrap()["type"],
        "spot_draft_confirmation"
    );
    let id = reply.rich_content.unwrap()["data"]["_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let draft = drafts(env)
        .find_one(doc! { "_id": oid(&id) })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        draft.get_str("botId").unwrap(),
        KAORI,
        "the draft names its companion"
    );
    assert_eq!(
        draft.get_str("conversationId").unwrap(),
        JESS_KAORI,
        "and its thread"
    );
    assert_eq!(draft.get_str("createdBy").unwrap(), "Kaori");
    oid(&id)
}

fn drafts(env: &TestEnv) -> mongodb::Collection<Document> {
    env.mongo.collection("spot_drafts")
}

/// What the admin tool stores before it publishes the review.
pub(crate) async fn review_in_mongo(env: &TestEnv, draft: ObjectId, set: Document) {
    drafts(env)
        .update_one(doc! { "_id": draft }, doc! { "$set": set })
        .await
        .unwrap();
}

/// Publishes a review as TB-Backend does (`Nats-Msg-Id: <draftId>:<status>` unless `msg_id` is given).
pub(crate) async fn publish_review(
    env: &TestEnv,
    draft: ObjectId,
    body: Value,
    msg_id: Option<&str>,
) {
    let status = body["status"].as_str().unwrap_or("x").to_owned();
    let id = msg_id.map_or_else(|| format!("{}:{status}", draft.to_hex()), str::to_owned);
    env.publish_raw(
        env.bus.names.spot_review(&draft.to_hex()),
        &id,
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
}

/// The next proactive completion in the stream, within `within`.
pub(crate) async fn next_proactive(
    replies: &mut (impl futures::Stream<Item = Completion> + Unpin),
    within: Duration,
) -> Completion {
    tokio::time::timeout(within, async {
        while let Some(c) = replies.next().await {
            if c.proactive {
                return c;
            }
        }
        panic!("completion stream ended")
    })
    .await
    .expect("a proactive message within the time")
}

/// dm_messages documents following up on `trigger_id`.
async fn follow_ups(env: &TestEnv, trigger_id: &str) -> Vec<Document> {
    use futures::TryStreamExt;
    env.mongo
        .collection("dm_messages")
        .find(doc! { "trigger.id": trigger_id })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_approved_review_reaches_the_user_once_with_the_spot_card() {
    let env = TestEnv::new(model(|_| StubReply::text("omg Hollow Bowl is LIVE 🎉"))).await;
    env.spawn_app().await;
    let draft = submit_draft(&env).await;
    let spot = ObjectId::new();
    env.mongo
        .collection("ck_spots")
        .insert_one(doc! { "_id": spot, "name": "Hollow Bowl", "city": "Portland", "state": "OR", "rating": 4.5 })
        .await
        .unwrap();
    review_in_mongo(&env, draft, doc! { "status": "approved", "spotId": spot }).await;

    let mut replies = env.completions(JESS_KAORI).await;
    let review = json!({"draftId": draft.to_hex(), "status": "approved", "spotId": spot.to_hex(), "reviewedAt": "2026-11-23T10:00:00Z"});
    publish_review(&env, draft, review.clone(), None).await;
    // The same review again: a JetStream duplicate.
    publish_review(&env, draft, review.clone(), None).await;

    let c = next_proactive(&mut replies, Duration::from_secs(30)).await;
    // Once more under another message id, later (a replay by hand): the journal says it was sent.
    publish_review(&env, draft, review, Some("by-hand-replay")).await;
    let trigger_id = format!("{}:approved", draft.to_hex());
    assert_eq!(c.content, "omg Hollow Bowl is LIVE 🎉");
    assert_eq!(c.sender_id, KAORI);
    assert_eq!(c.in_reply_to, None);
    let trigger = c.trigger.as_ref().unwrap();
    assert_eq!(
        (trigger.kind.as_str(), trigger.id.as_str()),
        ("spot_review", trigger_id.as_str())
    );
    let card = c.rich_content.as_ref().unwrap();
    assert_eq!(card["type"], "spot_card");
    assert_eq!(
        card["data"]["deepLink"],
        format!("trickbook://spot/{}", spot.to_hex())
    );
    assert_eq!(card["data"]["name"], "Hollow Bowl");
    assert_eq!(card["data"]["rating"], 4.5);

    // The model wrote it knowing what happened, in Kaori's voice and with the thread so far.
    let asked = env.stub.requests();
    let brief = last_message(asked.last().unwrap());
    assert_eq!(brief["role"], "system");
    let brief = brief["content"].as_str().unwrap();
    assert!(
        brief.contains("approved") && brief.contains("Hollow Bowl"),
        "{brief}"
    );
    let system = asked.last().unwrap()["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(system.contains("Kaori"), "{system}");
    assert!(
        asked
            .last()
            .unwrap()
            .get("tools")
            .is_none_or(|t| t.as_array().is_none_or(Vec::is_empty))
    );

    // Once: the replay by hand was handled (a second attempt of the job) and sent nothing.
    let journal = env.journal();
    assert!(
        eventually(Duration::from_secs(15), || async {
            journal
                .get(&format!("spot_review:{trigger_id}"))
                .await
                .unwrap()
                .is_some_and(|j| j.attempts == 2)
        })
        .await,
        "the republished review was handled"
    );
    let docs = follow_ups(&env, &trigger_id).await;
    assert_eq!(docs.len(), 1, "one message");
    assert!(docs[0].get_bool("proactive").unwrap());
    assert_eq!(
        docs[0].get_str("conversationId").ok(),
        None,
        "conversationId is an ObjectId"
    );
    assert_eq!(
        docs[0].get_object_id("conversationId").unwrap(),
        oid(JESS_KAORI)
    );
    let model_calls = env.stub.requests().len();
    assert_eq!(model_calls, 3, "two for the turn, one for the follow-up");
    // It is in the history the next turn sees.
    let next = env.dm(JESS, KAORI, JESS_KAORI, "wait really??").await;
    env.turn(&next).await;
    let history = env.stub.requests().last().unwrap()["messages"].to_string();
    assert!(history.contains("omg Hollow Bowl is LIVE"), "{history}");
    env.finish().await;
}

#[tokio::test]
async fn a_rejected_review_passes_the_note_on_and_the_plain_line_stands_in_for_a_failed_model() {
    // The model refuses every follow-up (400: no retry helps): the character's plain line is sent.
    let follow_up = |_: &str| StubReply::Status {
        code: 400,
        body: r#"{"error":{"message":"bad request"}}"#.into(),
        retry_after: None,
    };
    let env = TestEnv::new(model(follow_up)).await;
    env.spawn_app().await;
    let draft = submit_draft(&env).await;

    // Published before the admin tool stored the status: retried until MongoDB has it.
    let mut replies = env.completions(JESS_KAORI).await;
    publish_review(
        &env,
        draft,
        json!({"draftId": draft.to_hex(), "status": "rejected", "note": "that's a private backyard", "reviewedAt": "2026-11-23T10:00:00Z"}),
        None,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    review_in_mongo(&env, draft, doc! { "status": "rejected" }).await;

    let c = next_proactive(&mut replies, Duration::from_secs(30)).await;
    let kaori: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("characters/kaori.json")).unwrap(),
    )
    .unwrap();
    let expected = kaori["followUps"]["spotRejected"]
        .as_str()
        .unwrap()
        .replace("{spot}", "Hollow Bowl")
        .replace("{note}", " Moderator's note: that's a private backyard");
    assert_eq!(c.content, expected);
    assert!(c.rich_content.is_none());
    assert_eq!(
        c.trigger.unwrap().id,
        format!("{}:rejected", draft.to_hex())
    );
    // The model had been asked, with the note.
    let asked = env.stub.requests();
    let brief = last_message(asked.last().unwrap())["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        brief.contains("that's a private backyard") && brief.contains("did not approve"),
        "{brief}"
    );
    assert_eq!(
        follow_ups(&env, &format!("{}:rejected", draft.to_hex()))
            .await
            .len(),
        1
    );
    env.finish().await;
}

#[tokio::test]
async fn reviews_of_unknown_or_user_made_drafts_and_malformed_ones_are_dead_lettered() {
    let env = TestEnv::new(model(|_| StubReply::text("should not be sent"))).await;
    env.spawn_app().await;
    let unknown = ObjectId::new();
    let by_user = ObjectId::new();
    drafts(&env)
        .insert_one(doc! { "_id": by_user, "name": "Backyard", "status": "approved", "submittedBy": JESS, "submittedVia": "app" })
        .await
        .unwrap();
    let review = |d: ObjectId| json!({"draftId": d.to_hex(), "status": "approved", "reviewedAt": "2026-11-23T10:00:00Z"});
    publish_review(&env, unknown, review(unknown), None).await;
    publish_review(&env, by_user, review(by_user), None).await;
    // Not JSON; a draft id that is not the subject's.
    env.publish_raw(
        env.bus.names.spot_review(&unknown.to_hex()),
        "garbage",
        "{not json",
    )
    .await;
    publish_review(&env, unknown, review(by_user), Some("mismatch")).await;

    assert!(
        eventually(Duration::from_secs(20), || async {
            env.dead_letters().await.len() == 4
        })
        .await,
        "four dead letters: {:?}",
        env.dead_letters().await
    );
    let reasons: Vec<String> = env.dead_letters().await.into_iter().map(|d| d.0).collect();
    let has = |s: &str| reasons.iter().any(|r| r.contains(s));
    assert!(has(&format!("no spot draft {unknown}")), "{reasons:?}");
    assert!(has("was not made by a companion"), "{reasons:?}");
    assert!(has("not a spot review"), "{reasons:?}");
    assert!(has("does not match the subject"), "{reasons:?}");
    assert!(
        env.stub.requests().is_empty(),
        "no model call for any of them"
    );
    let sent: u64 = env
        .mongo
        .collection("dm_messages")
        .count_documents(doc! { "proactive": true })
        .await
        .unwrap();
    assert_eq!(sent, 0);
    env.finish().await;
}

#[tokio::test]
async fn a_worker_killed_between_the_model_call_and_the_write_still_sends_one_message() {
    let slow = |_: &str| {
        StubReply::Delayed(
            Duration::from_secs(2),
            Box::new(StubReply::text("your spot is live!!")),
        )
    };
    let env = TestEnv::with(model(slow), |c| {
        c.consumer.ack_wait_secs = 2;
        c.consumer.max_deliver = 5;
    })
    .await;
    let mut first = env.spawn_app_process(&[]);
    let draft = submit_draft(&env).await;
    let spot = ObjectId::new();
    review_in_mongo(&env, draft, doc! { "status": "approved", "spotId": spot }).await;
    let before = env.stub.requests().len();

    let mut replies = env.completions(JESS_KAORI).await;
    publish_review(
        &env,
        draft,
        json!({"draftId": draft.to_hex(), "status": "approved", "reviewedAt": "2026-11-23T10:00:00Z"}),
        None,
    )
    .await;
    // The model takes 2 s to answer; once it is asked, nothing more can be recorded in the journal while
    // this transaction holds the lock: the worker gets the answer and waits, before anything of it is
    // written.
    assert!(
        eventually(Duration::from_secs(30), || async {
            env.stub.requests().len() == before + 1
        })
        .await,
        "the worker asked the model"
    );
    let mut lock = sqlx::PgConnection::connect(&env.config.pg.url)
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut lock).await.unwrap();
    sqlx::query("LOCK TABLE job_steps IN SHARE MODE")
        .execute(&mut lock)
        .await
        .unwrap();
    let pool = env.pg.pool.clone();
    assert!(
        eventually(Duration::from_secs(30), || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            waiting > 0
        })
        .await,
        "the worker got the answer and waits to record it"
    );
    kill9(&mut first);
    // A statement the dead worker already sent would still run once the lock is free: its server session
    // goes with it, as the server would find on its next write to the dead connection.
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .execute(&mut lock)
    .await
    .unwrap();
    sqlx::query("ROLLBACK").execute(&mut lock).await.unwrap();

    let mut second = env.spawn_app_process(&[]);
    let c = next_proactive(&mut replies, Duration::from_secs(30)).await;
    assert_eq!(c.content, "your spot is live!!");
    let trigger_id = format!("{}:approved", draft.to_hex());
    // The signal (every delivery of it) is settled: a second message would have come before.
    env.drained(Drained::Signals).await;
    assert_eq!(follow_ups(&env, &trigger_id).await.len(), 1, "one message");
    assert_eq!(
        env.stub.requests().len(),
        before + 2,
        "the killed attempt's answer was never recorded, so the model was asked once more"
    );
    stop(&mut second);
    env.finish().await;
}

#[tokio::test]
async fn follow_ups_to_a_user_who_blocked_the_companion_or_is_over_the_daily_cap_are_dropped() {
    let env = TestEnv::with(model(|_| StubReply::text("news!")), |c| {
        c.follow_ups.daily_cap = 1;
    })
    .await;
    let worker = env.spawn_app().await;
    // Three drafts Kaori made for Jess, approved.
    let mut drafts_made = Vec::new();
    for name in ["One", "Two", "Three"] {
        let id = ObjectId::new();
        drafts(&env)
            .insert_one(doc! {
                "_id": id, "name": name, "status": "approved", "submittedBy": JESS,
                "botId": KAORI, "conversationId": JESS_KAORI, "createdBy": "Kaori",
            })
            .await
            .unwrap();
        drafts_made.push(id);
    }
    let review = |d: ObjectId| json!({"draftId": d.to_hex(), "status": "approved", "reviewedAt": "2026-11-23T10:00:00Z"});
    let journal = env.journal();
    let settled_as = |d: ObjectId| {
        let journal = journal.clone();
        async move {
            let id = format!("spot_review:{}:approved", d.to_hex());
            eventually(Duration::from_secs(20), || async {
                journal
                    .get(&id)
                    .await
                    .unwrap()
                    .is_some_and(|j| j.state.is_settled())
            })
            .await;
            let job = journal.get(&id).await.unwrap();
            (job.as_ref().map(|j| j.state), job.and_then(|j| j.reason))
        }
    };
    use companion_journal::State;

    // The first is sent; the second is over the cap of one a day.
    publish_review(&env, drafts_made[0], review(drafts_made[0]), None).await;
    assert_eq!(settled_as(drafts_made[0]).await.0, Some(State::Done));
    publish_review(&env, drafts_made[1], review(drafts_made[1]), None).await;
    let (state, why) = settled_as(drafts_made[1]).await;
    assert_eq!(state, Some(State::Dropped));
    assert!(why.unwrap().contains("daily cap of 1"));

    // Jess blocks Kaori: nothing more from her, whatever the cap.
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
    publish_review(&env, drafts_made[2], review(drafts_made[2]), None).await;
    let (state, why) = settled_as(drafts_made[2]).await;
    assert_eq!(state, Some(State::Dropped));
    assert!(why.unwrap().contains("blocked"));

    let sent = env
        .mongo
        .collection("dm_messages")
        .count_documents(doc! { "proactive": true })
        .await
        .unwrap();
    assert_eq!(sent, 1, "only the first");
    let metrics = worker.metrics().await;
    for line in [
        "companion_proactive_total{kind=\"spot_review\",outcome=\"sent\"} 1",
        "companion_proactive_total{kind=\"spot_review\",outcome=\"dropped\"} 2",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    worker.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn a_signal_that_outlives_its_deliveries_is_dead_lettered() {
    // The model never answers a follow-up in time: every worker that takes the review is killed.
    let hang = |_: &str| {
        StubReply::Delayed(
            Duration::from_secs(120),
            Box::new(StubReply::text("too late")),
        )
    };
    let env = TestEnv::with(model(hang), |c| {
        c.consumer.max_deliver = 2;
        c.consumer.ack_wait_secs = 2;
    })
    .await;
    let draft = ObjectId::new();
    drafts(&env)
        .insert_one(doc! {
            "_id": draft, "name": "Cursed Ledge", "status": "rejected", "submittedBy": JESS,
            "botId": KAORI, "conversationId": JESS_KAORI,
        })
        .await
        .unwrap();
    let mut first = env.spawn_app_process(&[]);
    publish_review(
        &env,
        draft,
        json!({"draftId": draft.to_hex(), "status": "rejected", "reviewedAt": "2026-11-23T10:00:00Z"}),
        None,
    )
    .await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            env.stub.requests().len() == 1
        })
        .await,
        "delivery 1"
    );
    kill9(&mut first);
    let mut second = env.spawn_app_process(&[]);
    assert!(
        eventually(Duration::from_secs(20), || async {
            env.stub.requests().len() == 2
        })
        .await,
        "delivery 2"
    );
    kill9(&mut second);
    let mut survivor = env.spawn_app_process(&[]);
    assert!(
        eventually(Duration::from_secs(30), || async {
            env.dead_letters().await.len() == 1
        })
        .await,
        "dead-lettered from the advisory"
    );
    let dead = env.dead_letters().await;
    assert!(dead[0].0.contains("2 deliveries"), "{:?}", dead[0].0);
    assert_eq!(env.stub.requests().len(), 2, "no third delivery");
    assert_eq!(
        follow_ups(&env, &format!("{}:rejected", draft.to_hex()))
            .await
            .len(),
        0
    );
    stop(&mut survivor);
    env.finish().await;
}

#[tokio::test]
async fn a_user_over_the_budget_gets_the_follow_up_as_its_plain_line_without_a_model_call() {
    // The draft's turn makes two paid calls of 0.011 USD: over the user's 0.02 USD budget.
    let env = TestEnv::with(model(|_| StubReply::text("the model's follow-up")), |c| {
        c.spend.user_daily_tokens = 0;
        c.spend.user_daily_usd = 0.02;
        c.spend.budget_model = String::new();
    })
    .await;
    env.stub.report_cost(Some(0.011));
    env.spawn_app().await;
    let draft = submit_draft(&env).await;
    assert_eq!(env.stub.requests().len(), 2);

    let mut replies = env.completions(JESS_KAORI).await;
    let spot = ObjectId::new();
    env.mongo
        .collection("ck_spots")
        .insert_one(doc! { "_id": spot, "name": "Hollow Bowl", "city": "Portland", "state": "OR", "rating": 4.5 })
        .await
        .unwrap();
    review_in_mongo(&env, draft, doc! { "status": "approved", "spotId": spot }).await;
    let review = json!({"draftId": draft.to_hex(), "status": "approved", "spotId": spot.to_hex(), "reviewedAt": "2026-11-23T10:00:00Z"});
    publish_review(&env, draft, review, None).await;
    let c = next_proactive(&mut replies, Duration::from_secs(30)).await;
    let kaori: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("characters/kaori.json")).unwrap(),
    )
    .unwrap();
    let expected = kaori["followUps"]["spotApproved"]
        .as_str()
        .unwrap()
        .replace("{spot}", "Hollow Bowl");
    assert_eq!(c.content, expected, "the plain line, not the model's");
    assert_eq!(env.stub.requests().len(), 2, "no call over the budget");
    env.finish().await;
}
