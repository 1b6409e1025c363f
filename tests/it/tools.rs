//! Each tool against the real MongoDB-wire server and PostgreSQL with the seed data.

use crate::env::*;
use bson::{Bson, Document, doc};
use companion::testing::pipeline::PipelineError;
use companion_core::failure::{Class, Classify};
use companion_dev::stub::{StubReply, always};
use companion_store::store::{SPOT_DRAFTS, SPOTS, TRICKLISTS};
use companion_tools::tools::{ToolContext, ToolError, ToolResult, Toolbox};
use futures::TryStreamExt;
use serde_json::{Value, json};

async fn call(tools: &Toolbox, ctx: &ToolContext<'_>, name: &str, args: Value) -> ToolResult {
    tools.dispatch(name, &args.to_string(), ctx).await
}

fn data(r: &ToolResult) -> &Value {
    &r.outcome
        .as_ref()
        .unwrap_or_else(|e| panic!("{} failed: {e}", r.name))
        .data
}

fn error(r: &ToolResult) -> Value {
    assert!(
        !r.is_ok(),
        "{} unexpectedly succeeded: {:?}",
        r.name,
        r.outcome
    );
    serde_json::from_str(&r.model_content()).unwrap()
}

fn names(v: &Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn search_spots_matches_filters_limits_and_is_literal() {
    let f = TestEnv::new(always(StubReply::text("unused"))).await;
    let tj_jess = f.tool_job(JESS).await;

    let ctx = tj_jess.ctx();
    let r = call(
        &tj_jess.tools,
        &ctx,
        "search_spots",
        json!({"query": "portland"}),
    )
    .await;
    assert!(names(data(&r), "spots").contains(&"Burnside Skatepark".to_owned()));
    let card = r.card().unwrap();
    assert_eq!(card["type"], "spots_list");
    let first = &card["data"][0];
    assert_eq!(
        first["deepLink"],
        format!("trickbook://spot/{}", first["_id"].as_str().unwrap())
    );
    // no matches: no card
    let r = call(
        &tj_jess.tools,
        &ctx,
        "search_spots",
        json!({"query": "zzzz-no-such-spot"}),
    )
    .await;
    assert_eq!(data(&r)["count"], 0);
    assert!(r.card().is_none());
    // limit (default 5, explicit 2)
    let r = call(&tj_jess.tools, &ctx, "search_spots", json!({"query": "e"})).await;
    assert_eq!(data(&r)["count"], 5);
    let r = call(
        &tj_jess.tools,
        &ctx,
        "search_spots",
        json!({"query": "e", "limit": 2}),
    )
    .await;
    assert_eq!(data(&r)["count"], 2);
    // type filter
    let r = call(
        &tj_jess.tools,
        &ctx,
        "search_spots",
        json!({"query": "e", "type": "diy", "limit": 20}),
    )
    .await;
    let spots = data(&r)["spots"].as_array().unwrap().clone();
    assert_eq!(spots.len(), 3);
    assert!(spots.iter().all(|s| s["type"] == "diy"));
    // regex metacharacters are literal
    for q in [".*", "(a+)+$", "^B", "[a-z]+", "Burnside|FDR"] {
        let r = call(&tj_jess.tools, &ctx, "search_spots", json!({"query": q})).await;
        assert_eq!(data(&r)["count"], 0, "query {q} must match literally");
    }
    // validation
    let e = error(
        &call(
            &tj_jess.tools,
            &ctx,
            "search_spots",
            json!({"query": "x".repeat(101)}),
        )
        .await,
    );
    assert_eq!(e["field"], "query");
    let e = error(
        &call(
            &tj_jess.tools,
            &ctx,
            "search_spots",
            json!({"query": "a", "limit": 21}),
        )
        .await,
    );
    assert_eq!(e["field"], "limit");
    let e = error(
        &call(
            &tj_jess.tools,
            &ctx,
            "search_spots",
            json!({"query": "a", "limit": 0}),
        )
        .await,
    );
    assert_eq!(e["field"], "limit");
    let e = error(
        &call(
            &tj_jess.tools,
            &ctx,
            "search_spots",
            json!({"query": "a", "type": "mall"}),
        )
        .await,
    );
    assert_eq!(e["field"], "type");
    let e = error(
        &call(
            &tj_jess.tools,
            &ctx,
            "search_spots",
            json!({"query": "   "}),
        )
        .await,
    );
    assert_eq!(e["field"], "query");
    let e = error(&call(&tj_jess.tools, &ctx, "search_spots", json!({})).await);
    assert_eq!(e["field"], "query");
    // null for an optional field means absent
    let r = call(
        &tj_jess.tools,
        &ctx,
        "search_spots",
        json!({"query": "portland", "type": null}),
    )
    .await;
    assert!(r.is_ok());
    f.finish().await;
}

#[tokio::test]
async fn get_user_tricklists_sees_only_own_lists() {
    let f = TestEnv::new(always(StubReply::text("unused"))).await;
    let tj_jess = f.tool_job(JESS).await;
    let tj_sam = f.tool_job(SAM).await;

    let jess = tj_jess.ctx();
    // empty-string arguments (OpenRouter for no-arg tools)
    let r = tj_jess
        .tools
        .dispatch("get_user_tricklists", "", &jess)
        .await;
    let mut got = names(data(&r), "tricklists");
    got.sort();
    assert_eq!(got, ["Park Essentials", "Winter Goals"]);
    let park = &data(&r)["tricklists"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "Park Essentials")
        .unwrap()
        .clone();
    assert_eq!(park["trickCount"], 5);
    assert_eq!(park["landed"], 3);
    assert_eq!(park["tricks"][0]["name"], "Ollie");
    assert_eq!(park["tricks"][0]["checked"], true);
    let r = call(
        &tj_jess.tools,
        &jess,
        "get_user_tricklists",
        json!({"listName": "PARK"}),
    )
    .await;
    assert_eq!(names(data(&r), "tricklists"), ["Park Essentials"]);
    let r = call(
        &tj_jess.tools,
        &jess,
        "get_user_tricklists",
        json!({"listName": ".*"}),
    )
    .await;
    assert_eq!(data(&r)["count"], 0);
    let sam = tj_sam.ctx();
    let r = call(&tj_sam.tools, &sam, "get_user_tricklists", json!({})).await;
    let mut got = names(data(&r), "tricklists");
    got.sort();
    assert_eq!(got, ["Sam's Secret List", "Sam's Street Basics"]);
    let e = error(
        &call(
            &tj_jess.tools,
            &jess,
            "get_user_tricklists",
            json!({"userId": SAM}),
        )
        .await,
    );
    assert!(
        e["error"].as_str().unwrap().contains("act for the user"),
        "{e}"
    );
    f.finish().await;
}

#[tokio::test]
async fn search_trickipedia_by_name_keyword_and_category() {
    let f = TestEnv::new(always(StubReply::text("unused"))).await;
    let tj_jess = f.tool_job(JESS).await;

    let ctx = tj_jess.ctx();
    let r = call(
        &tj_jess.tools,
        &ctx,
        "search_trickipedia",
        json!({"query": "kickflip"}),
    )
    .await;
    let got = names(data(&r), "tricks");
    assert_eq!(got[0], "Kickflip", "exact name first: {got:?}");
    assert!(got.contains(&"Varial Kickflip".to_owned()));
    let card = r.card().unwrap();
    assert_eq!(card["type"], "trick_card");
    assert_eq!(card["data"]["name"], "Kickflip");
    assert!(
        card["data"]["deepLink"]
            .as_str()
            .unwrap()
            .starts_with("trickbook://trick/")
    );
    // category filter picks the snowboard Boardslide
    let r = call(
        &tj_jess.tools,
        &ctx,
        "search_trickipedia",
        json!({"query": "boardslide", "category": "snowboard"}),
    )
    .await;
    assert_eq!(data(&r)["count"], 1);
    assert_eq!(data(&r)["tricks"][0]["category"], "snowboard");
    assert_eq!(r.card().unwrap()["type"], "trick_card");
    // keyword in the description, at most 10
    let r = call(
        &tj_jess.tools,
        &ctx,
        "search_trickipedia",
        json!({"query": "the"}),
    )
    .await;
    assert_eq!(data(&r)["count"], 10);
    assert!(r.card().is_none());
    let r = call(
        &tj_jess.tools,
        &ctx,
        "search_trickipedia",
        json!({"query": "no such trick"}),
    )
    .await;
    assert_eq!(data(&r)["count"], 0);
    for q in [".*", "(a+)+$", "Kick.lip"] {
        let r = call(
            &tj_jess.tools,
            &ctx,
            "search_trickipedia",
            json!({"query": q}),
        )
        .await;
        assert_eq!(data(&r)["count"], 0, "query {q} must match literally");
    }
    let e = error(
        &call(
            &tj_jess.tools,
            &ctx,
            "search_trickipedia",
            json!({"query": "x", "category": "golf"}),
        )
        .await,
    );
    assert_eq!(e["field"], "category");
    f.finish().await;
}

#[tokio::test]
async fn create_tricklist_stores_the_apps_shape_and_is_idempotent() {
    let f = TestEnv::new(always(StubReply::text("unused"))).await;
    let tj_jess = f.tool_job(JESS).await;

    let ctx = tj_jess.ctx();
    let args = json!({"name": "Park List", "tricks": ["kick flip", "50-50", "boardslide", "(a+)+$", "triple cork 1440"]});
    let r = call(&tj_jess.tools, &ctx, "create_tricklist", args.clone()).await;
    let d = data(&r).clone();
    assert_eq!(d["created"], true);
    assert_eq!(d["trickCount"], 3);
    let matched: Vec<&str> = d["matched"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["trick"].as_str().unwrap())
        .collect();
    assert_eq!(matched, ["Kickflip", "50-50 Grind", "Boardslide"]);
    assert_eq!(d["unmatched"], json!(["(a+)+$", "triple cork 1440"]));
    let card = r.card().unwrap();
    assert_eq!(card["type"], "tricklist_card");
    let id = oid(d["_id"].as_str().unwrap());
    assert_eq!(
        card["data"]["deepLink"],
        format!("trickbook://tricklist/{}", id.to_hex())
    );
    // The stored document, in the app's exact shape.
    let stored = f
        .mongo
        .collection(TRICKLISTS)
        .find_one(doc! {"_id": id})
        .await
        .unwrap()
        .unwrap();
    let user = stored.get_document("user").unwrap();
    let keys: Vec<&str> = user.keys().map(String::as_str).collect();
    assert_eq!(keys, ["$ref", "$id"]);
    assert_eq!(user.get_str("$ref").unwrap(), "users");
    assert_eq!(user.get_object_id("$id").unwrap(), oid(JESS));
    let tricks = stored.get_array("tricks").unwrap();
    assert_eq!(tricks.len(), 3);
    for t in tricks {
        let t = t.as_document().unwrap();
        assert!(t.get_object_id("_id").is_ok());
        assert!(!t.get_bool("checked").unwrap());
    }
    let boardslide = tricks[2]
        .as_document()
        .unwrap()
        .get_object_id("_id")
        .unwrap();
    let b = f
        .mongo
        .collection("tricks")
        .find_one(doc! {"_id": boardslide})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(b.get_str("category").unwrap(), "skateboard");
    assert_eq!(stored.get_str("category").unwrap(), "skateboard");
    assert_eq!(stored.get_str("createdBy").unwrap(), "Kaori");
    assert!(matches!(stored.get("createdAt"), Some(Bson::DateTime(_))));
    // DBRef round trip: the app's query shape finds it.
    let lists = f.mongo.user_tricklists(oid(JESS), 50).await.unwrap();
    assert!(lists.iter().any(|l| l.id == id && l.tricks.len() == 3));
    let sam_lists = f.mongo.user_tricklists(oid(SAM), 50).await.unwrap();
    assert!(sam_lists.iter().all(|l| l.id != id));
    // The same call again (a retry): same list, nothing new, quota counted once.
    let again = call(&tj_jess.tools, &ctx, "create_tricklist", args).await;
    assert_eq!(data(&again)["_id"], d["_id"]);
    assert_eq!(data(&again)["created"], false);
    let n = f
        .mongo
        .collection(TRICKLISTS)
        .count_documents(doc! {"name": "Park List"})
        .await
        .unwrap();
    assert_eq!(n, 1);
    let counted: i64 = sqlx::query_scalar("SELECT count(*) FROM job_steps WHERE name = 'quota'")
        .fetch_one(&f.pg.pool)
        .await
        .unwrap();
    assert_eq!(counted, 1);
    // Nothing matched: an error, no write.
    let e = error(
        &call(
            &tj_jess.tools,
            &tj_jess.ctx(),
            "create_tricklist",
            json!({"name": "X", "tricks": [".*"]}),
        )
        .await,
    );
    assert!(e["error"].as_str().unwrap().contains("none of the tricks"));
    // validation
    let e = error(
        &call(
            &tj_jess.tools,
            &ctx,
            "create_tricklist",
            json!({"name": "x".repeat(101), "tricks": ["ollie"]}),
        )
        .await,
    );
    assert_eq!(e["field"], "name");
    let e = error(
        &call(
            &tj_jess.tools,
            &ctx,
            "create_tricklist",
            json!({"name": "x", "tricks": []}),
        )
        .await,
    );
    assert_eq!(e["field"], "tricks");
    let e = error(
        &call(
            &tj_jess.tools,
            &ctx,
            "create_tricklist",
            json!({"name": "x", "tricks": "ollie"}),
        )
        .await,
    );
    assert_eq!(e["field"], "tricks");
    let e = error(
        &call(
            &tj_jess.tools,
            &ctx,
            "create_tricklist",
            json!({"name": "x", "tricks": ["ollie"], "user": {"$ref": "users", "$id": SAM}}),
        )
        .await,
    );
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("never for anyone else")
    );
    f.finish().await;
}

#[tokio::test]
async fn create_spot_draft_reads_maps_links_and_never_touches_spots() {
    let f = TestEnv::new(always(StubReply::text("unused"))).await;
    let tj_jess = f.tool_job(JESS).await;

    let spots_before = f
        .mongo
        .collection(SPOTS)
        .count_documents(doc! {})
        .await
        .unwrap();
    let ctx = tj_jess.ctx();
    let r = call(&tj_jess.tools, &ctx, "create_spot_draft", json!({
        "name": "Ledge Plaza", "type": "street", "city": "Portland",
        "mapsUrl": "https://www.google.com/maps/place/X/@45.0,-122.0,17z/data=!3m1!4b1!4m6!3m5!8m2!3d45.5231!4d-122.6651"
    })).await;
    let d = data(&r).clone();
    assert_eq!(d["latitude"], 45.5231);
    assert_eq!(d["longitude"], -122.6651);
    assert_eq!(r.card().unwrap()["type"], "spot_draft_confirmation");
    assert_eq!(r.card().unwrap()["data"]["status"], "pending_approval");
    let draft = f
        .mongo
        .collection(SPOT_DRAFTS)
        .find_one(doc! {"_id": oid(d["_id"].as_str().unwrap())})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(draft.get_str("status").unwrap(), "pending_approval");
    assert_eq!(draft.get_str("submittedBy").unwrap(), JESS);
    assert_eq!(draft.get_str("submittedVia").unwrap(), "Kaori");
    assert_eq!(draft.get_f64("latitude").unwrap(), 45.5231);
    // A short link: a draft without coordinates, flagged.
    let r = call(
        &tj_jess.tools,
        &tj_jess.ctx(),
        "create_spot_draft",
        json!({"name": "Mystery DIY", "type": "diy", "mapsUrl": "https://maps.app.goo.gl/AbC123"}),
    )
    .await;
    let d = data(&r).clone();
    assert_eq!(d["needsCoordinates"], true);
    assert!(d["latitude"].is_null());
    let draft = f
        .mongo
        .collection(SPOT_DRAFTS)
        .find_one(doc! {"_id": oid(d["_id"].as_str().unwrap())})
        .await
        .unwrap()
        .unwrap();
    assert!(draft.get_bool("shortLinkUnresolved").unwrap());
    assert_eq!(draft.get("latitude"), Some(&Bson::Null));
    // Apple, q=, manual coordinates
    let r = call(&tj_jess.tools, &tj_jess.ctx(), "create_spot_draft", json!({"name": "A", "type": "skatepark", "mapsUrl": "https://maps.apple.com/?ll=37.7749,-122.4194&q=Spot"})).await;
    assert_eq!(data(&r)["latitude"], 37.7749);
    // Refusals name the field; nothing is written.
    let bad = [
        (
            json!({"name": "A", "type": "street", "latitude": 91, "longitude": 0}),
            "latitude",
        ),
        (
            json!({"name": "A", "type": "street", "latitude": 0, "longitude": -180.5}),
            "longitude",
        ),
        (
            json!({"name": "A", "type": "street", "latitude": 10}),
            "longitude",
        ),
        (
            json!({"name": "A", "type": "street", "mapsUrl": "https://maps.google.com/?q=95,10"}),
            "mapsUrl",
        ),
        (
            json!({"name": "A", "type": "street", "mapsUrl": "https://example.com/@1,2"}),
            "mapsUrl",
        ),
        (json!({"name": "A", "type": "rooftop"}), "type"),
        (json!({"name": "", "type": "street"}), "name"),
    ];
    for (args, field) in bad {
        let e = error(
            &call(
                &tj_jess.tools,
                &tj_jess.ctx(),
                "create_spot_draft",
                args.clone(),
            )
            .await,
        );
        assert_eq!(e["field"], field, "{args}");
    }
    let drafts = f
        .mongo
        .collection(SPOT_DRAFTS)
        .count_documents(doc! {})
        .await
        .unwrap();
    assert_eq!(drafts, 3);
    let spots_after = f
        .mongo
        .collection(SPOTS)
        .count_documents(doc! {})
        .await
        .unwrap();
    assert_eq!(spots_before, spots_after);
    f.finish().await;
}

#[tokio::test]
async fn share_content_only_what_the_user_may_see() {
    let f = TestEnv::new(always(StubReply::text("unused"))).await;
    let tj_jess = f.tool_job(JESS).await;
    let tj_sam = f.tool_job(SAM).await;

    let jess = tj_jess.ctx();
    let share = |t: &str, id: &str| json!({"type": t, "id": id});
    // Sam's private list: refused like a missing one; Sam's public list and Jess's private list: cards.
    let e = error(
        &call(
            &tj_jess.tools,
            &jess,
            "share_content",
            share("tricklist", "6650f1a2b3c4d5e6f7a8f003"),
        )
        .await,
    );
    assert!(e["error"].as_str().unwrap().contains("no tricklist"));
    let r = call(
        &tj_jess.tools,
        &jess,
        "share_content",
        share("tricklist", "6650f1a2b3c4d5e6f7a8f004"),
    )
    .await;
    assert_eq!(r.card().unwrap()["type"], "tricklist_card");
    assert_eq!(r.card().unwrap()["data"]["name"], "Sam's Street Basics");
    let r = call(
        &tj_jess.tools,
        &jess,
        "share_content",
        share("tricklist", "6650f1a2b3c4d5e6f7a8f002"),
    )
    .await;
    assert_eq!(r.card().unwrap()["data"]["name"], "Winter Goals");
    let r = call(
        &tj_sam.tools,
        &tj_sam.ctx(),
        "share_content",
        share("tricklist", "6650f1a2b3c4d5e6f7a8f003"),
    )
    .await;
    assert_eq!(r.card().unwrap()["data"]["name"], "Sam's Secret List");
    let r = call(
        &tj_jess.tools,
        &jess,
        "share_content",
        share("spot", "6650f1a2b3c4d5e6f7a8e001"),
    )
    .await;
    let card = r.card().unwrap();
    assert_eq!(card["type"], "spot_card");
    assert_eq!(
        card["data"]["deepLink"],
        "trickbook://spot/6650f1a2b3c4d5e6f7a8e001"
    );
    let r = call(
        &tj_jess.tools,
        &jess,
        "share_content",
        share("trick", "6650f1a2b3c4d5e6f7a8d005"),
    )
    .await;
    assert_eq!(r.card().unwrap()["type"], "trick_card");
    assert_eq!(r.card().unwrap()["data"]["name"], "Kickflip");
    // unknown and invalid ids
    let e = error(
        &call(
            &tj_jess.tools,
            &jess,
            "share_content",
            share("spot", "6650f1a2b3c4d5e6f7a8ffff"),
        )
        .await,
    );
    assert!(e["error"].as_str().unwrap().contains("no spot"));
    let e = error(
        &call(
            &tj_jess.tools,
            &jess,
            "share_content",
            share("spot", "not-an-id"),
        )
        .await,
    );
    assert_eq!(e["field"], "id");
    let e = error(
        &call(
            &tj_jess.tools,
            &jess,
            "share_content",
            share("video", "6650f1a2b3c4d5e6f7a8e001"),
        )
        .await,
    );
    assert_eq!(e["field"], "type");
    f.finish().await;
}

#[tokio::test]
async fn malformed_calls_are_error_results() {
    let f = TestEnv::new(always(StubReply::text("unused"))).await;
    let tj_jess = f.tool_job(JESS).await;

    let ctx = tj_jess.ctx();
    let reg = &tj_jess.tools;
    let r = reg
        .dispatch("search_spots", "{\"query\": \"port", &ctx)
        .await;
    assert!(
        error(&r)["error"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );
    let r = reg.dispatch("search_spots", "[1,2]", &ctx).await;
    assert_eq!(error(&r)["field"], "(arguments)");
    let r = reg.dispatch("search_spots", "", &ctx).await;
    assert_eq!(error(&r)["field"], "query");
    let r = reg.dispatch("delete_everything", "{}", &ctx).await;
    assert!(
        error(&r)["error"]
            .as_str()
            .unwrap()
            .contains("unknown tool")
    );
    let r = reg.dispatch("share_content", "  ", &ctx).await;
    assert!(!r.is_ok());
    f.finish().await;
}

/// Two "workers" (each with its own MongoDB client and PostgreSQL pool) create lists for one user at
/// once: exactly five writes succeed, the rest get the quota error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn write_quota_holds_across_workers() {
    let f = TestEnv::new(always(StubReply::text("unused"))).await;
    let tj_sam = f.tool_job(SAM).await;
    let mut workers = Vec::new();
    for w in 0..2 {
        let components = f.spawn_app().await;
        workers.push(tokio::spawn(async move {
            let calls = (0..6).map(|i| {
                let (journal, c) = (&components.pipeline.journal, &components);
                async move {
                    // Each call is another event's turn.
                    let tj =
                        ToolJob::open(journal, c.mongo.clone(), c.pg.clone(), c.bus.clone(), JESS)
                            .await;
                    let mut ctx = tj.ctx();
                    ctx.call.id = format!("call_w{w}_{i}");
                    tj.tools
                        .dispatch(
                            "create_tricklist",
                            &json!({"name": format!("Quota {w}-{i}"), "tricks": ["ollie"]})
                                .to_string(),
                            &ctx,
                        )
                        .await
                }
            });
            futures::future::join_all(calls).await
        }));
    }
    let mut ok = 0;
    let mut refused = 0;
    for w in workers {
        for r in w.await.unwrap() {
            match &r.outcome {
                Ok(_) => ok += 1,
                Err(e) => {
                    assert!(e.to_string().contains("write limit"), "{e}");
                    refused += 1;
                }
            }
        }
    }
    assert_eq!((ok, refused), (5, 7));
    let lists: Vec<Document> = f
        .mongo
        .collection(TRICKLISTS)
        .find(doc! {"createdBy": "Kaori"})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(lists.len(), 5);
    // Another user is not affected.
    let r = call(
        &tj_sam.tools,
        &tj_sam.ctx(),
        "create_tricklist",
        json!({"name": "Sam's", "tricks": ["ollie"]}),
    )
    .await;
    assert!(r.is_ok());
    f.finish().await;
}

/// A database failure is not shown to the model as a result: the turn fails with it (transient: the
/// write may or may not have happened, and a retry is harmless). Reads that do not need PostgreSQL keep
/// working.
#[tokio::test]
async fn database_errors_fail_the_turn_instead_of_answering() {
    let f = TestEnv::new(always(StubReply::text("unused"))).await;
    let components = f.spawn_app().await;
    let tj = ToolJob::open(
        &components.pipeline.journal,
        f.mongo.clone(),
        components.pg.clone(),
        components.bus.clone(),
        JESS,
    )
    .await;
    components.pg.pool.close().await;
    let ctx = tj.ctx();
    let r = call(
        &tj.tools,
        &ctx,
        "create_tricklist",
        json!({"name": "X", "tricks": ["ollie"]}),
    )
    .await;
    let e = r.outcome.unwrap_err();
    assert!(matches!(e, ToolError::Journal(_)), "{e}");
    let e = PipelineError::from(e);
    assert_eq!(e.class(), Class::Transient, "{e}");
    let r = call(
        &tj.tools,
        &ctx,
        "search_spots",
        json!({"query": "portland"}),
    )
    .await;
    assert!(r.is_ok());
    let n = f
        .mongo
        .collection(TRICKLISTS)
        .count_documents(doc! {"name": "X"})
        .await
        .unwrap();
    assert_eq!(n, 0);
    f.finish().await;
}
