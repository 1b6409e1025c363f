//! TB-Backend's fan-out service (`deploy/tb-backend/server.js`) through the real worker, with a real
//! `socket.io-client` (`deploy/tb-backend/test/socket-probe.js`): a reply reaches its user once with typing
//! before it, a completion that reaches the service twice is emitted once, a restarted service catches up,
//! a group's private referral reaches only its user, a crisis card arrives whole, and a client without a
//! valid token for its own user receives nothing. And the chat page (`deploy/tb-backend/public/`) in headless
//! Chromium: a reply with its card, a reminder arriving by itself, a group's answers.

use crate::env::*;
use companion_dev::stub::{StubReply, always};
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// The key the tests' tokens are signed with (the service reads it from TB_JWT_SECRET).
const SECRET: &str = "tests-only-secret-0123456789abcdef0123456789";
const WAIT: Duration = Duration::from_secs(60);

fn node_modules_installed() {
    assert!(
        root()
            .join("deploy/tb-backend/node_modules/socket.io-client")
            .exists(),
        "the fan-out's packages are not installed: run `npm ci --prefix deploy/tb-backend` (deploy/local/test.sh does)"
    );
}

/// One fan-out service process, on this test's streams and database.
pub(crate) struct Fanout {
    child: Child,
    pub url: String,
    port: u16,
}

impl Fanout {
    pub(crate) async fn start(env: &TestEnv) -> Self {
        Self::start_on(env, 0).await
    }

    /// Starts the service on `port` (0: any free port) and waits for its "listening" line.
    pub(crate) async fn start_on(env: &TestEnv, port: u16) -> Self {
        node_modules_installed();
        // Its log, for a look after a failure (deploy/local/test.sh keeps the temp folder then).
        let log = std::env::temp_dir().join(format!("tb-backend-{:016x}.log", fastrand::u64(..)));
        let mut child = Command::new("node")
            .arg(root().join("deploy/tb-backend/server.js"))
            .env("TB_JWT_SECRET", SECRET)
            .env("TB_HTTP_ADDR", format!("127.0.0.1:{port}"))
            .env("ATLAS_URI", &env.config.mongo.uri)
            .env("NATS_URL", &env.config.nats.url)
            .env("COMPANION_SUBJECT_PREFIX", &env.config.nats.subject_prefix)
            .env("COMPANION_STREAM_PREFIX", &env.config.nats.stream_prefix)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .kill_on_drop(true)
            .spawn()
            .expect("node runs");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("the service starts within a minute")
            .unwrap()
            .unwrap_or_else(|| {
                panic!(
                    "the service ended before it listened: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            });
        let url = line
            .strip_prefix("tb-backend listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line}"))
            .to_owned();
        let port = url.rsplit(':').next().unwrap().parse().unwrap();
        Self { child, url, port }
    }

    /// Kills the service at once (SIGKILL): what it had not acknowledged is redelivered to the next one.
    pub(crate) async fn kill(mut self) -> u16 {
        self.child.kill().await.unwrap();
        self.port
    }

    /// Sends `text` to a conversation as `user` through the service's API, as the app does; the stored
    /// message's id.
    pub(crate) async fn send(&self, user: &str, conversation: &str, text: &str) -> String {
        let res = reqwest::Client::new()
            .post(format!(
                "{}/api/conversations/{conversation}/messages",
                self.url
            ))
            .bearer_auth(token(user, &[]).await)
            .json(&json!({ "content": text }))
            .send()
            .await
            .unwrap();
        assert_eq!(
            res.status(),
            201,
            "{}",
            res.text().await.unwrap_or_default()
        );
        let doc: Value = res.json().await.unwrap();
        doc["_id"].as_str().unwrap().to_owned()
    }

    pub(crate) async fn health(&self) -> Value {
        reqwest::get(format!("{}/healthz", self.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

/// A token for `user`, minted by the service's own `mint-token.js` (`extra`: its options), signed with
/// the tests' key.
pub(crate) async fn token(user: &str, extra: &[&str]) -> String {
    token_signed(user, extra, SECRET).await
}

async fn token_signed(user: &str, extra: &[&str], secret: &str) -> String {
    let out = Command::new("node")
        .arg(root().join("deploy/tb-backend/mint-token.js"))
        .arg(user)
        .args(extra)
        .env("TB_JWT_SECRET", secret)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A Socket.IO client: what it saw, one JSON object per event.
pub(crate) struct Probe {
    _child: Child,
    events: mpsc::UnboundedReceiver<Value>,
    pub seen: Vec<Value>,
}

impl Probe {
    pub(crate) async fn connect(url: &str, token: &str, user: Option<&str>) -> Self {
        node_modules_installed();
        let mut cmd = Command::new("node");
        cmd.arg(root().join("deploy/tb-backend/test/socket-probe.js"))
            .arg(url)
            .arg(token);
        if let Some(user) = user {
            cmd.args(["--user", user]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs");
        let (tx, events) = mpsc::unbounded_channel();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let v: Value = serde_json::from_str(&line).expect("one JSON object per line");
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Self {
            _child: child,
            events,
            seen: Vec::new(),
        }
    }

    /// Waits for the first event (from now) that `pred` accepts; everything it saw is kept in `seen`.
    pub(crate) async fn until(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some(v)) => {
                    self.seen.push(v.clone());
                    if pred(&v) {
                        return v;
                    }
                }
                Ok(None) => panic!("the client ended before {what}; it saw {:#?}", self.seen),
                Err(_) => panic!("no {what} within {WAIT:?}; the client saw {:#?}", self.seen),
            }
        }
    }

    pub(crate) async fn connected(&mut self) {
        self.until("connect", |v| v["event"] == "connect").await;
    }

    /// The `new_message` with this `_id` (waited for).
    pub(crate) async fn message(&mut self, id: &str) -> Value {
        self.until(&format!("message {id}"), |v| {
            v["event"] == "new_message" && v["data"]["_id"] == id
        })
        .await["data"]
            .clone()
    }

    /// The companion's reply to `id` (a DM's inReplyTo, a group's respondsTo), waited for.
    pub(crate) async fn reply_to(&mut self, id: &str) -> Value {
        self.until(&format!("the reply to {id}"), |v| {
            v["event"] == "new_message"
                && (v["data"]["inReplyTo"] == id || v["data"]["respondsTo"] == id)
        })
        .await["data"]
            .clone()
    }

    /// How many `new_message` events with this `_id` it saw so far.
    pub(crate) fn count(&self, id: &str) -> usize {
        self.seen
            .iter()
            .filter(|v| v["event"] == "new_message" && v["data"]["_id"] == id)
            .count()
    }
}

#[tokio::test]
async fn a_dm_reply_reaches_its_user_once_with_typing_before_it() {
    let env = TestEnv::new(always(StubReply::text("kickflips need commitment 🛹"))).await;
    env.spawn_app().await;
    let fanout = Fanout::start(&env).await;
    let mut jess = Probe::connect(&fanout.url, &token(JESS, &[]).await, Some(JESS)).await;
    jess.connected().await;

    let sent = fanout
        .send(JESS, JESS_KAORI, "how do i commit to kickflips?")
        .await;
    // Her own message comes back to her sockets (her other devices), then typing, then the reply.
    jess.message(&sent).await;
    let reply = jess.reply_to(&sent).await;
    assert_eq!(reply["content"], "kickflips need commitment 🛹");
    assert_eq!(reply["senderId"], KAORI);
    assert_eq!(reply["conversationId"], JESS_KAORI);
    let reply_id = reply["_id"].as_str().unwrap().to_owned();
    let typing_at = jess
        .seen
        .iter()
        .position(|v| v["event"] == "typing" && v["data"]["isTyping"] == true)
        .unwrap_or_else(|| panic!("no typing before the reply: {:#?}", jess.seen));
    let reply_at = jess
        .seen
        .iter()
        .position(|v| v["event"] == "new_message" && v["data"]["_id"] == reply_id.as_str())
        .unwrap();
    assert!(typing_at < reply_at, "{:#?}", jess.seen);
    assert_eq!(jess.seen[typing_at]["data"]["userId"], KAORI);
    // It is the document the worker stored.
    let stored = env.replies_to(&sent).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(
        stored[0].get_object_id("_id").unwrap().to_hex(),
        reply_id.as_str()
    );

    // Once: a second turn's reply is the positive event after which the first cannot still come.
    let second = fanout.send(JESS, JESS_KAORI, "and heelflips?").await;
    jess.reply_to(&second).await;
    assert_eq!(jess.count(&reply_id), 1, "{:#?}", jess.seen);
    assert_eq!(jess.count(&sent), 1);
    env.finish().await;
}

#[tokio::test]
async fn a_completion_that_reaches_the_fanout_twice_is_emitted_once() {
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    let fanout = Fanout::start(&env).await;
    let mut jess = Probe::connect(&fanout.url, &token(JESS, &[]).await, None).await;
    jess.connected().await;
    let completion = |id: &str, content: &str| {
        json!({
            "messageId": id, "conversationId": JESS_KAORI, "senderId": KAORI, "content": content,
            "richContent": null, "createdAt": "2026-11-29T10:00:00Z", "inReplyTo": bson::oid::ObjectId::new().to_hex(),
        })
        .to_string()
    };
    let twice = bson::oid::ObjectId::new().to_hex();
    let subject = env.bus.names.outbound(JESS_KAORI);
    // Two copies the stream keeps both of (no Nats-Msg-Id), as a worker's second publish after the
    // duplicate window would be.
    for _ in 0..2 {
        env.bus
            .js
            .publish(subject.clone(), completion(&twice, "once please").into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let marker = bson::oid::ObjectId::new().to_hex();
    env.bus
        .js
        .publish(subject.clone(), completion(&marker, "after it").into())
        .await
        .unwrap()
        .await
        .unwrap();
    jess.message(&marker).await;
    assert_eq!(jess.count(&twice), 1, "{:#?}", jess.seen);
    let health = fanout.health().await;
    assert_eq!(health["duplicates"], 1, "{health}");
    assert_eq!(health["emitted"], 2, "{health}");
    env.finish().await;
}

#[tokio::test]
async fn a_fanout_restarted_mid_stream_catches_up_on_completions() {
    let env = TestEnv::new(always(StubReply::text("still here"))).await;
    env.spawn_app().await;
    let fanout = Fanout::start(&env).await;
    let mut jess = Probe::connect(&fanout.url, &token(JESS, &[]).await, Some(JESS)).await;
    jess.connected().await;
    let first = fanout.send(JESS, JESS_KAORI, "one").await;
    jess.reply_to(&first).await;

    let port = fanout.kill().await;
    jess.until("the disconnect", |v| v["event"] == "disconnect")
        .await;
    // While the service is down, a message reaches the worker (TB-Backend has more than one process)
    // and is answered.
    let event = env
        .dm(JESS, KAORI, JESS_KAORI, "two, while you were away")
        .await;
    env.publish(&event).await;
    let answered = eventually(WAIT, || async {
        !env.replies_to(&event.message_id).await.is_empty()
    })
    .await;
    assert!(answered, "the worker answers while the fan-out is down");

    let fanout = Fanout::start_on(&env, port).await;
    let missed = jess.reply_to(&event.message_id).await;
    assert_eq!(missed["content"], "still here");
    let third = fanout.send(JESS, JESS_KAORI, "three").await;
    jess.reply_to(&third).await;
    let missed_id = missed["_id"].as_str().unwrap();
    assert_eq!(jess.count(missed_id), 1, "{:#?}", jess.seen);
    assert!(
        jess.seen.iter().filter(|v| v["event"] == "connect").count() >= 2,
        "the client reconnected: {:#?}",
        jess.seen
    );
    env.finish().await;
}

#[tokio::test]
async fn a_group_referral_reaches_only_its_user_and_its_card_arrives_whole() {
    let env = TestEnv::new(always(StubReply::text("big session vibes today"))).await;
    env.spawn_app().await;
    let group =
        companion_dev::backend::create_group(&env.mongo, &[oid(JESS), oid(SAM)], &[oid(KAORI)])
            .await
            .unwrap()
            .to_hex();
    let fanout = Fanout::start(&env).await;
    let mut jess = Probe::connect(&fanout.url, &token(JESS, &[]).await, Some(JESS)).await;
    let mut sam = Probe::connect(&fanout.url, &token(SAM, &[]).await, Some(SAM)).await;
    jess.connected().await;
    sam.connected().await;

    let crisis = fanout.send(JESS, &group, CRISIS_TEXT).await;
    let referral = jess
        .until("the referral", |v| {
            v["event"] == "new_message" && v["data"]["safety"] == "crisis"
        })
        .await["data"]
        .clone();
    assert_eq!(referral["visibleTo"], json!([JESS]));
    assert_eq!(referral["richContent"]["type"], "crisis_resources");
    // The card as the worker stored it, every line with every field.
    let stored = env
        .mongo
        .collection("dm_messages")
        .find_one(bson::doc! { "_id": oid(referral["_id"].as_str().unwrap()) })
        .await
        .unwrap()
        .expect("the referral is stored");
    let stored_card: Value =
        serde_json::to_value(stored.get_document("richContent").unwrap()).unwrap();
    assert_eq!(referral["richContent"], stored_card);
    let lines = referral["richContent"]["data"]["lines"].as_array().unwrap();
    assert!(!lines.is_empty());
    assert!(
        lines
            .iter()
            .all(|l| l["name"].is_string() && l["kind"].is_string()),
        "{lines:#?}"
    );

    // Sam sees the group's messages (Jess's own included) and the answer to his, never the referral.
    sam.message(&crisis).await;
    let his = fanout.send(SAM, &group, "kaori, what's up?").await;
    sam.reply_to(&his).await;
    let referral_id = referral["_id"].as_str().unwrap();
    assert_eq!(sam.count(referral_id), 0, "{:#?}", sam.seen);
    assert!(
        sam.seen
            .iter()
            .all(|v| v["data"]["safety"].is_null() && v["data"]["visibleTo"].is_null()),
        "{:#?}",
        sam.seen
    );
    // Nor when he loads the conversation.
    let history: Vec<Value> = reqwest::Client::new()
        .get(format!("{}/api/conversations/{group}/messages", fanout.url))
        .bearer_auth(token(SAM, &[]).await)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(history.iter().any(|m| m["_id"] == crisis.as_str()));
    assert!(
        history.iter().all(|m| m["_id"] != referral_id),
        "{history:#?}"
    );
    env.finish().await;
}

#[tokio::test]
async fn a_client_without_a_valid_token_for_its_own_user_receives_nothing() {
    let env = TestEnv::new(always(StubReply::text("only for jess"))).await;
    env.spawn_app().await;
    let fanout = Fanout::start(&env).await;
    let forged = token_signed(JESS, &[], "someone-elses-secret-0123456789abcdef").await;
    let expired = token(JESS, &["--expires-in", "-60"]).await;
    let sams = token(SAM, &[]).await;
    let mut refused = vec![
        (
            "forged",
            Probe::connect(&fanout.url, &forged, Some(JESS)).await,
        ),
        (
            "expired",
            Probe::connect(&fanout.url, &expired, Some(JESS)).await,
        ),
        (
            "another user's",
            Probe::connect(&fanout.url, &sams, Some(JESS)).await,
        ),
        ("none", Probe::connect(&fanout.url, "", Some(JESS)).await),
    ];
    let mut reasons = Vec::new();
    for (what, probe) in &mut refused {
        let err = probe
            .until(&format!("the {what} token's refusal"), |v| {
                v["event"] == "connect_error" || v["event"] == "connect"
            })
            .await;
        assert_eq!(err["event"], "connect_error", "a {what} token connected");
        reasons.push((err["code"].clone(), err["message"].clone()));
    }
    assert_eq!(reasons[0].0, "token_invalid", "{reasons:?}");
    assert!(
        reasons[0].1.as_str().unwrap().contains("signature"),
        "{reasons:?}"
    );
    assert_eq!(reasons[1].0, "token_expired", "{reasons:?}");
    assert_eq!(reasons[2].0, "wrong_user", "{reasons:?}");
    assert_eq!(reasons[3].0, "no_token", "{reasons:?}");
    // The API refuses them too.
    let res = reqwest::Client::new()
        .get(format!("{}/api/conversations", fanout.url))
        .bearer_auth(&forged)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);

    let mut jess = Probe::connect(&fanout.url, &token(JESS, &[]).await, Some(JESS)).await;
    jess.connected().await;
    let sent = fanout.send(JESS, JESS_KAORI, "just us?").await;
    jess.reply_to(&sent).await;
    for (what, probe) in &mut refused {
        while let Ok(v) = probe.events.try_recv() {
            probe.seen.push(v);
        }
        assert!(
            probe.seen.iter().all(|v| v["event"] == "connect_error"),
            "the {what} token's client got {:#?}",
            probe.seen
        );
    }
    env.finish().await;
}

/// Debian's Chromium (or CHROMIUM): the browser test fails without it, it never skips.
fn chromium() -> String {
    let path = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&path).exists(),
        "no Chromium at {path}: the browser test needs Debian's chromium (deploy/local/test.sh installs it as root; \
         otherwise `sudo apt-get install chromium`, or CHROMIUM=<path>)"
    );
    path
}

#[tokio::test]
async fn the_chat_page_in_chromium_shows_a_reply_its_card_a_reminder_and_a_group() {
    let browser = chromium();
    let env = TestEnv::with(companion_dev::stub::demo(), |c| {
        c.turn.reminder_min_lead_secs = 5;
    })
    .await;
    env.spawn_app().await;
    let group =
        companion_dev::backend::create_group(&env.mongo, &[oid(JESS)], &[oid(KAORI), oid(TONY)])
            .await
            .unwrap()
            .to_hex();
    let fanout = Fanout::start(&env).await;
    let shot = std::env::temp_dir().join(format!("web-chat-{}.png", env.tag));
    let out = Command::new("node")
        .arg(root().join("deploy/tb-backend/test/web-check.js"))
        .args(["--url", &fanout.url, "--token", &token(JESS, &[]).await])
        .args(["--dm", JESS_KAORI, "--group", &group])
        .arg("--screenshot")
        .arg(&shot)
        .args(["--crisis", CRISIS_TEXT])
        .env("CHROMIUM", &browser)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the page check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(
        summary["steps"],
        json!([
            "connected",
            "reply with a card",
            "reply",
            "reminder arrived",
            "screenshot",
            "group answered",
            "crisis card"
        ]),
        "{stdout}"
    );
    // The crisis card shows every line the worker stored, in its order, with its kind, hours and cost.
    let referral = env
        .mongo
        .collection("dm_messages")
        .find_one(bson::doc! { "conversationId": oid(JESS_KAORI), "safety": "crisis" })
        .await
        .unwrap()
        .expect("the referral is stored");
    let stored: Value = serde_json::to_value(
        referral
            .get_document("richContent")
            .unwrap()
            .get_document("data")
            .unwrap(),
    )
    .unwrap();
    let stored = stored["lines"].as_array().unwrap();
    let shown = summary["crisisLines"].as_array().unwrap();
    assert_eq!(shown.len(), stored.len(), "{shown:#?} vs {stored:#?}");
    for (shown, stored) in shown.iter().zip(stored) {
        assert_eq!(shown["name"], stored["name"]);
        assert_eq!(shown["kind"], stored["kind"]);
        let tags: Vec<&str> = shown["tags"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        if let Some(hours) = stored["hours"].as_str() {
            assert!(
                tags.iter().any(|t| t.contains(hours)),
                "hours {hours}: {shown}"
            );
        }
        match stored["cost"].as_str() {
            Some("free") => assert!(tags.contains(&"free"), "{shown}"),
            Some(cost) => assert_eq!(shown["cost"], format!("cost: {cost}")),
            None => {}
        }
        if let Some(phone) = stored["phone"].as_str() {
            let digits: String = phone.chars().filter(|c| c.is_ascii_digit()).collect();
            assert!(
                shown["links"].as_array().unwrap().iter().any(|l| l
                    .as_str()
                    .is_some_and(|l| l.starts_with("tel:") && l.contains(&digits))),
                "a call button for {phone}: {shown}"
            );
        }
    }
    assert_eq!(
        summary["errors"],
        json!([]),
        "the page logged errors: {stdout}"
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
    // What the page showed is what the worker stored: the reminder is a proactive message in the DM.
    let proactive = env
        .mongo
        .collection("dm_messages")
        .count_documents(bson::doc! { "conversationId": oid(JESS_KAORI), "proactive": true })
        .await
        .unwrap();
    assert_eq!(proactive, 1);
    env.finish().await;
}
