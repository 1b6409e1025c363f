//! Test harness: every test gets a fresh PostgreSQL database, a fresh MongoDB database seeded with the demo
//! data, its own NATS subject and stream prefixes, a scripted stub LLM and (on demand) an in-process worker.

use crate::servers;

use std::{path::PathBuf, sync::Arc, time::Duration};

use companion::{Config, testing::startup::App};
use companion_journal::{Job, Journal, NewJob};
use companion_knowledge::rag::{EmbedConfig, Embedder};
use companion_store::{
    bus::{
        Bus,
        event::{Completion, InboundEvent},
    },
    store::{Mongo, Pg},
};
use companion_tools::tools::{Call, Clock, ToolContext};

use async_nats::HeaderMap;
use bson::{Document, doc, oid::ObjectId};
use bytes::Bytes;
use companion_dev::{
    backend, seed,
    stub::{self, AsyncResponder, Responder, StubLlm, StubReply},
};
use futures::{StreamExt, TryStreamExt};
use sqlx::Connection;
use tokio_util::sync::CancellationToken;

pub const JESS: &str = "6650f1a2b3c4d5e6f7a8b9c0";
pub const SAM: &str = "6650f1a2b3c4d5e6f7a8b9c1";
pub const KAORI: &str = "69c15e55c7ebe2c6884f1267";
pub const TONY: &str = "69c15e55c7ebe2c6884f1268";
pub const RICO: &str = "69c15e55c7ebe2c6884f1269";
pub const ZOE: &str = "69c15e55c7ebe2c6884f126b";
/// Jess's conversation with Kaori in the seed data.
pub const JESS_KAORI: &str = "6650f1a2b3c4d5e6f7a8c001";
/// A message the crisis screen's rules flag (self-harm).
pub const CRISIS_TEXT: &str = "honestly i just want to die, i don't see the point anymore";

pub fn oid(s: &str) -> ObjectId {
    ObjectId::parse_str(s).expect("test ids are valid")
}

/// SecantusDB (the local MongoDB-wire server) can deadlock when one connection creates a collection while
/// another inserts into a new one; tests therefore create and drop their collections one test at a time.
static COLLECTION_DDL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub struct TestEnv {
    pub tag: String,
    /// Superuser URL of the PostgreSQL server the test database lives on.
    pub admin_url: String,
    pub config: Config,
    pub stub: StubLlm,
    pub mongo: Mongo,
    pub pg: Pg,
    pub bus: Bus,
    /// Fired by [`TestEnv::finish`]: stops every worker [`TestEnv::spawn_app`] started.
    shutdown: CancellationToken,
    /// The in-process workers, awaited by [`TestEnv::finish`] before the databases go.
    workers: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl TestEnv {
    /// A fresh, seeded environment whose LLM answers with `responder`.
    pub async fn new(responder: Responder) -> Self {
        Self::with(responder, |_| {}).await
    }

    /// Like [`TestEnv::new`], with a chance to change the configuration first.
    pub async fn with(responder: Responder, adjust: impl FnOnce(&mut Config)) -> Self {
        Self::on(&Servers::from_env(), responder, adjust).await
    }

    /// Like [`TestEnv::with`], on the given servers (e.g. a [`PrivateStack`]).
    pub async fn on(
        servers: &Servers,
        responder: Responder,
        adjust: impl FnOnce(&mut Config),
    ) -> Self {
        Self::build(servers, stub::asynchronous(responder), adjust).await
    }

    /// Like [`TestEnv::new`], with a model that answers asynchronously (e.g. with the embedding model).
    pub async fn with_model(responder: AsyncResponder) -> Self {
        Self::build(&Servers::from_env(), responder, |_| {}).await
    }

    /// The one builder behind the others.
    async fn build(
        servers: &Servers,
        responder: AsyncResponder,
        adjust: impl FnOnce(&mut Config),
    ) -> Self {
        let tag = format!("{:016x}", fastrand::u64(..));
        let mut config = Config::from_env().expect("configuration from the environment");
        config.nats.url = servers.nats_url.clone();
        config.pg.url = servers.postgres_url.clone();
        config.mongo.uri = servers.atlas_uri.clone();
        let db = format!("t_{tag}");
        create_pg_database(&servers.admin_url, &db).await;
        config.pg.url = replace_db(&config.pg.url, &db);
        config.mongo.uri = replace_db(&config.mongo.uri, &db);
        config.nats.subject_prefix = format!("t{tag}.dm.bot");
        config.nats.stream_prefix = format!("T{tag}");
        config.consumer.name = "workers".into();
        config.characters.dir = root().join("characters");
        config.characters.flows_dir = root().join("flows");
        config.worker.retry_delay_secs = 1;
        config.consumer.max_deliver = 3;
        config.consumer.max_ack_pending = 32;
        config.worker.concurrency = 8;
        config.worker.shutdown_grace_secs = 5;
        config.worker.http_addr = "127.0.0.1:0".into();
        let models = embed_config();
        config.embed.model_dir = models.model_dir;
        config.embed.ort_dylib_path = models.ort_dylib_path;
        let stub = StubLlm::start_async("127.0.0.1:0".parse().unwrap(), responder, true)
            .await
            .expect("stub LLM starts");
        config.llm.base_url = stub.base_url.clone();
        // The safety tests (tests/it/safety.rs) turn these on; other tests compare exact replies.
        config.safety.ai_disclosure = false;
        config.safety.unknown_age_is_minor = false;
        // Memory extraction is a background request to the model after 10 user messages; the memory
        // tests (tests/it/memory.rs) set their own, other tests count the model's requests.
        config.memory.extract_after = 1_000_000;
        adjust(&mut config);

        let pg = Pg::connect(&config.pg)
            .await
            .expect("PostgreSQL is up (deploy/local/stack.sh up)");
        pg.migrate().await.expect("migrations apply");
        let mongo = Mongo::connect(&config.mongo).await.expect("MongoDB client");
        prepare_mongo(&mongo).await;
        let bus = Bus::connect(&config.nats).await.expect("NATS is up");
        bus.ensure_streams().await.expect("streams");
        Self {
            tag,
            admin_url: servers.admin_url.clone(),
            config,
            stub,
            mongo,
            pg,
            bus,
            shutdown: CancellationToken::new(),
            workers: Default::default(),
        }
    }

    /// Starts a worker in this process as `companion worker` does ([`App::run`]): built with its own
    /// connections, its operations endpoint bound on an ephemeral port, then run. It runs until
    /// [`TestApp::stop`] or [`TestEnv::finish`]; dropping the handle leaves it running. The one way a test
    /// starts an in-process worker; [`TestEnv::spawn_app_process`] starts one as a process.
    pub async fn spawn_app(&self) -> TestApp {
        let bound = App::build(&self.config)
            .await
            .expect("the app builds")
            .bind()
            .await;
        let app = bound.app.clone();
        let addr = bound.ops_addr().expect("the operations endpoint listens");
        let stop = self.shutdown.child_token();
        let (done, exited) = tokio::sync::oneshot::channel();
        let token = stop.clone();
        let running = tokio::spawn(async move {
            let result = bound.run(token).await.map_err(|e| e.to_string());
            if let Err(e) = &result {
                eprintln!("the in-process worker failed: {e}");
            }
            let _ = done.send(result);
        });
        self.workers.lock().expect("workers").push(running);
        TestApp {
            app,
            base: format!("http://{addr}"),
            stop,
            exited,
        }
    }

    /// The workers' consumer as the server sees it (none before a worker created it).
    pub async fn consumer_info(&self) -> Option<async_nats::jetstream::consumer::Info> {
        let mut consumer = self
            .bus
            .js
            .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                self.config.consumer.name.clone(),
                self.bus.names.stream_in.clone(),
            )
            .await
            .ok()?;
        consumer.info().await.ok().cloned()
    }

    /// Waits until the workers' consumer of `which` holds nothing undelivered or unacknowledged: every
    /// message published to its stream before this call has been settled (acked, terminated, or its
    /// last delivery dead-lettered). The positive event a test waits for before it asserts that
    /// something did *not* happen (docs/development.md, "How tests wait").
    pub async fn drained(&self, which: Drained) {
        let (consumer, stream) = match which {
            Drained::Inbound => (
                self.config.consumer.name.clone(),
                self.bus.names.stream_in.clone(),
            ),
            Drained::Signals => (
                companion_store::bus::signal_consumer_name(&self.config.consumer.name),
                self.bus.names.stream_signal.clone(),
            ),
        };
        let done = eventually(Duration::from_secs(60), || async {
            let Ok(mut c) = self
                .bus
                .js
                .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                    consumer.clone(),
                    stream.clone(),
                )
                .await
            else {
                return false;
            };
            c.info()
                .await
                .is_ok_and(|i| i.num_pending == 0 && i.num_ack_pending == 0)
        })
        .await;
        assert!(
            done,
            "the {which:?} consumer did not settle everything within 60 s"
        );
    }

    /// The last sequence of the stream `which`'s consumer reads (0: empty).
    pub async fn stream_last(&self, which: Drained) -> u64 {
        let name = match which {
            Drained::Inbound => &self.bus.names.stream_in,
            Drained::Signals => &self.bus.names.stream_signal,
        };
        let mut stream = self.bus.js.get_stream(name).await.expect("stream");
        stream
            .info()
            .await
            .expect("stream info")
            .state
            .last_sequence
    }

    /// Waits until the stream `which` holds a message after sequence `after` (one a worker publishes
    /// on its own, e.g. a memory signal after a turn), then until it is [`TestEnv::drained`].
    pub async fn drained_after(&self, which: Drained, after: u64) {
        let published = eventually(Duration::from_secs(30), || async {
            self.stream_last(which).await > after
        })
        .await;
        assert!(
            published,
            "nothing was published to {which:?} after {after}"
        );
        self.drained(which).await;
    }

    /// Waits until a worker pulls from the consumer (it has connected to every server and started).
    pub async fn wait_worker_pulling(&self, within: Duration) -> bool {
        eventually(within, || async {
            self.consumer_info()
                .await
                .is_some_and(|info| info.num_waiting > 0)
        })
        .await
    }

    /// Starts `companion worker` as a separate process on this environment (stdout/stderr to a log file);
    /// killed when dropped, so a failed assertion leaves no worker behind.
    pub fn spawn_app_process(&self, extra_env: &[(&str, &str)]) -> WorkerProcess {
        let log = std::env::temp_dir().join(format!(
            "companion-worker-{}-{}.log",
            self.tag,
            fastrand::u32(..)
        ));
        let out = std::fs::File::create(&log).expect("worker log file");
        let mut cmd = self.command(&["worker"]);
        cmd.stdout(out.try_clone().expect("log handle")).stderr(out);
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        eprintln!("worker process log: {}", log.display());
        WorkerProcess(cmd.spawn().expect("companion binary starts"), log)
    }

    /// The `companion` binary with `args`, configured exactly as this environment (nothing inherited
    /// but `PATH`).
    pub fn command(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_companion"));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .envs(companion_dev::child_env::of(&self.config));
        cmd
    }

    /// Runs `companion <args>` to completion; returns (exit ok, stdout, stderr).
    pub async fn run_companion(&self, args: &[&str]) -> (bool, String, String) {
        let mut cmd = tokio::process::Command::from(self.command(args));
        let out = cmd.output().await.expect("companion runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The name of this environment's PostgreSQL database.
    pub fn pg_database(&self) -> String {
        format!("t_{}", self.tag)
    }

    /// The journal of this environment's database.
    pub fn journal(&self) -> Journal {
        Journal::new(self.pg.pool.clone())
    }

    /// A turn's job for a new event message of `user` to Kaori, for calling tools directly.
    pub async fn tool_job(&self, user: &str) -> ToolJob {
        ToolJob::open(
            &self.journal(),
            self.mongo.clone(),
            self.pg.clone(),
            self.bus.clone(),
            user,
        )
        .await
    }

    /// `n` earlier messages of JESS and KAORI's DM in the history (user and companion in turn, the
    /// `i`-th saying `text(i)`), an hour ago, oldest first.
    pub async fn earlier_messages(&self, n: usize, text: impl Fn(usize) -> String) {
        let base = chrono::Utc::now() - chrono::Duration::hours(1);
        for i in 0..n {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            sqlx::query("INSERT INTO bot_conversations (user_id, bot_id, conversation_id, role, content, message_id, created_at) VALUES ($1,$2,$3,$4,$5,$6,$7)")
                .bind(JESS).bind(KAORI).bind(JESS_KAORI).bind(role)
                .bind(text(i))
                .bind(format!("h{i}-{}", self.tag))
                .bind(base + chrono::Duration::seconds(i as i64))
                .execute(&self.pg.pool).await.unwrap();
        }
    }

    /// Stores a DM from `user` to `bot` as TB-Backend does and returns its event (not yet published).
    pub async fn dm(&self, user: &str, bot: &str, conversation: &str, text: &str) -> InboundEvent {
        backend::store_user_message(
            &self.mongo,
            oid(conversation),
            oid(user),
            oid(bot),
            text,
            &[],
        )
        .await
        .expect("user message stored")
    }

    /// Jess's `text` in a new group of hers with `bots`, stored and published as TB-Backend would.
    pub async fn group_message(
        &self,
        bots: &[&str],
        text: &str,
    ) -> companion_store::bus::event::GroupMessageEvent {
        let bots: Vec<ObjectId> = bots.iter().map(|b| oid(b)).collect();
        let group = backend::create_group(&self.mongo, &[oid(JESS)], &bots)
            .await
            .expect("group created");
        let e = backend::store_group_message(&self.mongo, group, oid(JESS), text)
            .await
            .expect("stored");
        backend::publish_group_message(&self.bus, &e)
            .await
            .expect("published");
        e
    }

    /// The DM conversation of `user` and `bot` (created as TB-Backend would when missing).
    pub async fn conversation(&self, user: &str, bot: &str) -> String {
        backend::ensure_conversation(&self.mongo, oid(user), oid(bot))
            .await
            .expect("conversation")
            .to_hex()
    }

    /// `n` new users, each in a new conversation with `bot`: `(user id, conversation id)`.
    pub async fn new_conversations(&self, bot: &str, n: usize) -> Vec<(String, String)> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let (user, conversation) = (ObjectId::new(), ObjectId::new());
            self.mongo
                .collection("dm_conversations")
                .insert_one(doc! { "_id": conversation, "participants": [user, oid(bot)] })
                .await
                .expect("conversation stored");
            out.push((user.to_hex(), conversation.to_hex()));
        }
        out
    }

    /// Every completion of this environment, subscribed now (subscribe before publishing).
    pub async fn all_completions(&self) -> impl futures::Stream<Item = Completion> + Unpin + use<> {
        let sub = self
            .bus
            .client
            .subscribe(format!("{}.out.>", self.bus.names.prefix))
            .await
            .expect("subscribed");
        Box::pin(
            sub.filter_map(
                |m| async move { serde_json::from_slice::<Completion>(&m.payload).ok() },
            ),
        )
    }

    /// Publishes an event as TB-Backend does; returns whether JetStream saw a duplicate.
    pub async fn publish(&self, event: &InboundEvent) -> bool {
        backend::publish_event(&self.bus, event)
            .await
            .expect("published")
    }

    /// Publishes raw bytes on an inbound subject, with a message id.
    pub async fn publish_raw(&self, subject: String, msg_id: &str, payload: impl Into<Bytes>) {
        self.bus
            .publish_durable(subject, msg_id, HeaderMap::new(), payload.into())
            .await
            .expect("raw publish");
    }

    /// Publishes a signal as TB-Backend does (`<prefix>.signal.<kind>.<id>`), with a message id.
    pub async fn signal(&self, kind: &str, id: &str, msg_id: &str, body: impl Into<Bytes>) {
        let subject = format!("{}.signal.{kind}.{id}", self.bus.names.prefix);
        self.publish_raw(subject, msg_id, body).await;
    }

    /// Completions of a conversation, subscribed now (subscribe before publishing).
    pub async fn completions(
        &self,
        conversation: &str,
    ) -> impl futures::Stream<Item = Completion> + Unpin + use<> {
        Box::pin(
            backend::completions(&self.bus, oid(conversation))
                .await
                .expect("subscribed"),
        )
    }

    /// Publishes and waits for the reply to this event.
    pub async fn turn(&self, event: &InboundEvent) -> Completion {
        let mut replies = self.completions(&event.conversation_id).await;
        self.publish(event).await;
        next_reply_to(&mut replies, &event.message_id, Duration::from_secs(30)).await
    }

    /// Waits (up to 30 s) until job `id` is settled; its record.
    pub async fn settled(&self, id: &str) -> companion_journal::JobRecord {
        let journal = self.journal();
        let done = eventually(Duration::from_secs(30), || async {
            journal
                .get(id)
                .await
                .unwrap()
                .is_some_and(|j| j.state.is_settled())
        })
        .await;
        assert!(done, "job {id} did not settle");
        journal.get(id).await.unwrap().unwrap()
    }

    /// A pending reminder of Jess's with Kaori, due now (as if `schedule_reminder` had stored it); its id.
    pub async fn due_reminder(&self, text: &str) -> String {
        use companion_store::{store::Reminder, store::ReminderState};
        let (id, now) = (ObjectId::new().to_hex(), chrono::Utc::now());
        self.pg
            .insert_reminder(&Reminder {
                id: id.clone(),
                user_id: JESS.into(),
                bot_id: KAORI.into(),
                conversation_id: JESS_KAORI.into(),
                text: text.into(),
                due_at: now,
                fire_at: now,
                state: ReminderState::Pending,
            })
            .await
            .expect("reminder stored");
        id
    }

    /// Fires reminder `id` as its schedule would (`<prefix>.signal.reminder.<id>`, message id
    /// `due-<id>`) and waits until its job is settled; the job's record.
    pub async fn fire_reminder(&self, id: &str) -> companion_journal::JobRecord {
        let body = serde_json::json!({"reminderId": id, "fireAt": chrono::Utc::now()});
        self.publish_raw(
            self.bus.names.reminder_due(id),
            &format!("due-{id}"),
            body.to_string(),
        )
        .await;
        self.settled(&format!("reminder:{id}")).await
    }

    pub async fn replies_to(&self, message_id: &str) -> Vec<Document> {
        self.mongo
            .collection("dm_messages")
            .find(doc! { "inReplyTo": oid(message_id) })
            .await
            .expect("find")
            .try_collect()
            .await
            .expect("collect")
    }

    /// Dead letters recorded so far: `(reason, payload)`.
    pub async fn dead_letters(&self) -> Vec<(String, Bytes)> {
        let stream = self
            .bus
            .js
            .get_stream(&self.bus.names.stream_dlq)
            .await
            .expect("dlq stream");
        let mut out = Vec::new();
        let mut seq = 1;
        while let Ok(msg) = stream.get_raw_message(seq).await {
            let reason = msg
                .headers
                .get(companion_store::bus::DLQ_REASON)
                .map(|v| v.to_string())
                .unwrap_or_default();
            out.push((reason, msg.payload));
            seq += 1;
        }
        out
    }

    /// The reasons of the dead letters, in order.
    pub async fn dead_letter_reasons(&self) -> Vec<String> {
        self.dead_letters()
            .await
            .into_iter()
            .map(|(r, _)| r)
            .collect()
    }

    /// Stops the workers and removes this test's streams and databases.
    pub async fn finish(self) {
        self.shutdown.cancel();
        let workers = std::mem::take(&mut *self.workers.lock().expect("workers"));
        for w in workers {
            let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
        }
        // The journal has no foreign key (migrations/20261129000000_journal_lean.sql): every writer opens
        // its job before it records a step of it. Every test's journal says whether that held.
        let orphans: Result<i64, _> = sqlx::query_scalar(
            "SELECT count(*) FROM job_steps s WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = s.job)",
        )
        .fetch_one(&self.pg.pool)
        .await;
        let db = format!("t_{}", self.tag);
        if let Ok(n) = orphans
            && n > 0
        {
            remove_streams_and_database(&self.bus, &self.pg, &self.admin_url, &db).await;
            panic!("{n} journal steps without their job");
        }
        remove_streams_and_database(&self.bus, &self.pg, &self.admin_url, &db).await;
        drop_mongo(&self.mongo).await;
    }
}

/// The last tool result the model was sent (the `tool` message of the stub's latest request), as JSON.
pub fn last_tool_result(stub: &companion_dev::stub::StubLlm) -> serde_json::Value {
    let result = stub.requests().last().expect("a request")["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .cloned()
        .expect("the tool's result went back to the model");
    serde_json::from_str(result["content"].as_str().expect("text")).expect("JSON result")
}

/// Waits for the completion answering `message_id` (discarding others); panics if none comes `within`.
pub async fn next_reply_to(
    replies: &mut (impl futures::Stream<Item = Completion> + Unpin),
    message_id: &str,
    within: Duration,
) -> Completion {
    reply_within(replies, message_id, within)
        .await
        .unwrap_or_else(|| panic!("no reply to {message_id} within {within:?}"))
}

/// The completion answering `message_id`, if one comes `within`.
pub async fn reply_within(
    replies: &mut (impl futures::Stream<Item = Completion> + Unpin),
    message_id: &str,
    within: Duration,
) -> Option<Completion> {
    tokio::time::timeout(within, async {
        while let Some(c) = replies.next().await {
            if c.in_reply_to.as_deref() == Some(message_id) {
                return Some(c);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

/// The validated form of an event built by [`TestEnv::dm`], for calling `pipeline::run` directly.
pub fn dm_event(raw: &InboundEvent) -> companion_store::bus::event::DmEvent {
    companion_store::bus::event::DmEvent {
        message_id: oid(&raw.message_id),
        conversation_id: oid(&raw.conversation_id),
        sender_id: oid(&raw.sender_id),
        bot_id: oid(&raw.bot_id),
        content: raw.content.clone(),
        images: raw.attachments.iter().map(|a| a.url.clone()).collect(),
        sent_at: raw.sent_at,
    }
}

/// A model that answers the user's message with `first` (a tool call, asked afresh on every attempt),
/// fails the next request once with a 500, and answers every later one with `then`.
pub fn tool_then_one_500(first: StubReply, then: StubReply) -> Responder {
    let failed = std::sync::atomic::AtomicBool::new(false);
    Arc::new(move |body: &serde_json::Value| {
        if last_message(body)["role"] == "user" {
            first.clone()
        } else if !failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            StubReply::Status {
                code: 500,
                body: "upstream hiccup".into(),
                retry_after: None,
            }
        } else {
            then.clone()
        }
    })
}

/// A moderator's pause of `conversation`, as the takeover signal stores it (no signal, no worker).
pub async fn stored_pause(env: &TestEnv, conversation: &str) {
    sqlx::query(
        "INSERT INTO takeovers (conversation_id, paused, by_whom, at, paused_at)
         VALUES ($1, true, 'moderator-1', now(), now())",
    )
    .bind(conversation)
    .execute(&env.pg.pool)
    .await
    .unwrap();
}

/// A worker running in the test's own process ([`TestEnv::spawn_app`]), with its operations endpoint.
/// Derefs to its parts, which a test may call directly while it runs; [`TestApp::stop`] asserts that it
/// exits cleanly.
pub struct TestApp {
    app: App,
    /// `http://<addr>` of the operations endpoint.
    pub base: String,
    stop: CancellationToken,
    /// The worker's result, sent when it exits.
    exited: tokio::sync::oneshot::Receiver<Result<(), String>>,
}

impl std::ops::Deref for TestApp {
    type Target = App;
    fn deref(&self) -> &App {
        &self.app
    }
}

impl TestApp {
    /// The text of `/metrics`.
    pub async fn metrics(&self) -> String {
        get_text(&format!("{}/metrics", self.base)).await
    }

    /// The value of one series of `/metrics` (`name{labels}` exactly as rendered), if present.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        series_value(&self.metrics().await, series)
    }

    /// Stops the worker and waits for it; panics unless it exits cleanly.
    pub async fn stop(self) {
        self.stop.cancel();
        self.exited
            .await
            .expect("worker task")
            .expect("worker exits cleanly");
    }
}

/// The value of one series (`name{labels}` exactly as rendered) in the Prometheus text `metrics`.
pub fn series_value(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|v| v.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// A turn's job for calling tools directly: a new event message of one user to Kaori, and the tools
/// built with this job's stores.
pub struct ToolJob {
    pub job: Job,
    pub tools: companion_tools::tools::Toolbox,
    pub user: ObjectId,
    pub message_id: ObjectId,
}

impl ToolJob {
    pub async fn open(journal: &Journal, mongo: Mongo, pg: Pg, bus: Bus, user: &str) -> Self {
        let message_id = ObjectId::new();
        let id = message_id.to_hex();
        let job = journal
            .open(&NewJob {
                id: &id,
                kind: "turn",
                user,
                bot: KAORI,
                conversation: JESS_KAORI,
                stream_seq: None,
                reads: Default::default(),
            })
            .await
            .expect("job opens");
        let tools = companion_tools::tools::Toolbox::new(&companion_tools::tools::ToolStores {
            mongo,
            pg,
            bus,
            flows: NO_FLOWS.clone(),
            reminders: companion_tools::tools::ReminderBounds {
                min_lead: Duration::from_secs(60),
            },
            writes_per_hour: 5,
        });
        Self {
            job,
            tools,
            user: oid(user),
            message_id,
        }
    }

    /// A tool context acting for the user, answering as Kaori, for a new call of this event.
    pub fn ctx(&self) -> ToolContext<'_> {
        let call = format!("call_{}", fastrand::u32(..));
        ToolContext {
            user: self.user,
            bot: oid(KAORI),
            conversation: oid(JESS_KAORI),
            character: "Kaori",
            message_id: self.message_id,
            call: Call {
                key: format!("{call}:test"),
                id: call,
            },
            clock: Clock {
                now: chrono::Utc::now(),
                time_zone: None,
                minor_quiet: None,
            },
            job: &self.job,
            offered_flows: &[],
            memory: companion_memory::Access::Off,
        }
    }
}

/// Tool tests outside a flow.
static NO_FLOWS: std::sync::LazyLock<std::sync::Arc<companion_flows::Flows>> =
    std::sync::LazyLock::new(Default::default);

/// The body of a GET.
pub async fn get_text(url: &str) -> String {
    reqwest::get(url)
        .await
        .expect("GET")
        .text()
        .await
        .expect("body")
}

/// A `companion worker` process of one test; killed (and reaped) when dropped. Derefs to its `Child`.
pub struct WorkerProcess(std::process::Child, PathBuf);

impl WorkerProcess {
    /// What the worker logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.1).unwrap_or_default()
    }
}

impl std::ops::Deref for WorkerProcess {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for WorkerProcess {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        // A child already waited for is not signalled again (std knows its status).
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends SIGTERM to a worker process; panics if the signal cannot be sent.
pub fn sigterm(child: &std::process::Child) {
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs")
        .success();
    assert!(ok, "SIGTERM sent");
}

/// Kills a worker process without letting it clean up, as a crash would.
pub fn kill9(child: &mut std::process::Child) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// Stops a worker process at the end of a test (SIGTERM, then wait for it).
pub fn stop(child: &mut std::process::Child) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// Waits for a worker process to exit; panics if it is still running after `within`.
pub async fn wait_exit(
    child: &mut std::process::Child,
    within: Duration,
) -> std::process::ExitStatus {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "worker did not exit within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A consumer [`TestEnv::drained`] waits on.
#[derive(Clone, Copy, Debug)]
pub enum Drained {
    /// DMs and group messages.
    Inbound,
    /// Follow-ups, memory and moderation signals.
    Signals,
}

/// The honest failure line of a shipped character (`characters/<slug>.json`).
pub fn failure_line(slug: &str) -> String {
    character_line(slug, "failureLine")
}

/// One fixed line (`failureLine`, `busyLine`, `budgetLine`) of a shipped character.
pub fn character_line(slug: &str, key: &str) -> String {
    let path = root().join(format!("characters/{slug}.json"));
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("character file"))
            .expect("character JSON");
    c[key].as_str().expect(key).to_owned()
}

/// Every system message of a request, joined: the system prompt, and the knowledge, flow and time
/// placed after the history.
pub fn system_text(body: &serde_json::Value) -> String {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "system")
        .filter_map(|m| m["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The last message of a chat request the stub received (what a scripted responder reacts to).
pub fn last_message(body: &serde_json::Value) -> serde_json::Value {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or_default()
}

/// Polls `check` until it returns true or `within` passes.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates every collection (so no insert creates one implicitly), the worker's indexes and the demo data.
pub async fn prepare_mongo(mongo: &Mongo) {
    let _ddl = COLLECTION_DDL.lock().await;
    for name in COLLECTIONS {
        mongo
            .db
            .create_collection(*name)
            .await
            .expect("create collection");
    }
    mongo.ensure_indexes().await.expect("indexes");
    seed::seed_dir(mongo, &root().join("deploy/local/seed"))
        .await
        .expect("seed data loads");
}

/// Drops a test database, one at a time (see [`COLLECTION_DDL`]).
pub async fn drop_mongo(mongo: &Mongo) {
    let _ddl = COLLECTION_DDL.lock().await;
    let _ = tokio::time::timeout(Duration::from_secs(5), mongo.db.drop()).await;
}

/// Where the servers of a test are.
#[derive(Clone, Debug)]
pub struct Servers {
    pub nats_url: String,
    pub postgres_url: String,
    pub admin_url: String,
    pub atlas_uri: String,
}

impl Servers {
    /// The shared local stack, as `deploy/local/stack.sh env` exports it.
    pub fn from_env() -> Self {
        let c = Config::from_env().expect("configuration from the environment");
        Self {
            admin_url: admin_url(&c.pg.url),
            nats_url: c.nats.url,
            postgres_url: c.pg.url,
            atlas_uri: c.mongo.uri,
        }
    }
}

/// A throwaway stack of its own (NATS, PostgreSQL, the MongoDB-wire server) on free ports, started by
/// `deploy/local/stack.sh` with the shared stack's venv, for tests that stop and restart servers.
/// Stopped and removed when dropped.
pub struct PrivateStack {
    dir: PathBuf,
    ports: [u16; 4],
    pub servers: Servers,
}

impl PrivateStack {
    pub async fn start() -> Self {
        use servers::free_ports;
        let ports = free_ports::<4>();
        let dir = std::env::temp_dir().join(format!("companion-stack-{:016x}", fastrand::u64(..)));
        let [nats, _, pg, mongo] = ports;
        let stack = Self {
            dir,
            ports,
            servers: Servers {
                nats_url: format!("nats://127.0.0.1:{nats}"),
                postgres_url: format!("postgres://companion:companion@127.0.0.1:{pg}/companion"),
                admin_url: format!("postgres://postgres:postgres@127.0.0.1:{pg}/postgres"),
                atlas_uri: format!("mongodb://127.0.0.1:{mongo}/TrickList2?directConnection=true"),
            },
        };
        stack.run(&["up"]).await;
        stack
    }

    /// Stops one server (`nats`, `postgres` or `mongo`).
    pub async fn stop(&self, server: &str) {
        self.run(&["down", server]).await;
    }

    /// Freezes one server and its processes (SIGSTOP): it keeps its connections and answers nothing,
    /// as a stall or a failover looks.
    pub async fn freeze(&self, server: &str) {
        self.run(&["freeze", server]).await;
    }

    /// Lets a frozen server go on (SIGCONT).
    pub async fn thaw(&self, server: &str) {
        self.run(&["thaw", server]).await;
    }

    /// Starts whatever is stopped and waits until all three are healthy.
    pub async fn up(&self) {
        self.run(&["up"]).await;
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let [nats, monitor, pg, mongo] = self.ports;
        let local = servers::local_dir();
        let mut cmd = std::process::Command::new(root().join("deploy/local/stack.sh"));
        cmd.args(args)
            .env("COMPANION_LOCAL_DIR", &self.dir)
            .env("COMPANION_VENV", local.join("venv"))
            .env("NATS_PORT", nats.to_string())
            .env("NATS_MONITOR_PORT", monitor.to_string())
            .env("PG_PORT", pg.to_string())
            .env("MONGO_PORT", mongo.to_string())
            .stdin(std::process::Stdio::null());
        cmd
    }

    async fn run(&self, args: &[&str]) {
        let out = tokio::process::Command::from(self.command(args))
            .output()
            .await
            .expect("stack.sh runs");
        assert!(
            out.status.success(),
            "stack.sh {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PrivateStack {
    fn drop(&mut self) {
        // A frozen server would not stop.
        for server in ["nats", "postgres", "mongo"] {
            let _ = self.command(&["thaw", server]).output();
        }
        let _ = self.command(&["down"]).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub use companion_dev::bench::env::{
    COLLECTIONS, admin_url, remove_streams_and_database, replace_db,
};

async fn create_pg_database(admin_url: &str, name: &str) {
    let mut conn = sqlx::PgConnection::connect(admin_url)
        .await
        .expect("admin connection to PostgreSQL");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE {name} OWNER companion"
    )))
    .execute(&mut conn)
    .await
    .expect("create test database");
}

/// The model files as configured (`COMPANION_MODEL_DIR`, `ORT_DYLIB_PATH`), else `<repo>/.local/models`.
pub fn embed_config() -> EmbedConfig {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let local = std::env::var_os("COMPANION_LOCAL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".local"));
    let model_dir = std::env::var_os("COMPANION_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| local.join("models"));
    let ort_dylib_path = std::env::var_os("ORT_DYLIB_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| model_dir.join("libonnxruntime.so.1.31.1"));
    let defaults: companion::config::EmbedSettings =
        companion::config::from_env().expect("embedding settings");
    let encoder = companion_knowledge::rag::Encoder::named(&defaults.encoder).expect("an encoder");
    EmbedConfig {
        model_dir,
        encoder,
        model_file: match defaults.model_file.trim() {
            "" => encoder.int8_file.to_owned(),
            file => file.to_owned(),
        },
        ort_dylib_path,
        threads: 1,
        max_batch: 32,
        window: Duration::from_millis(5),
    }
}

/// Loads the embedder; fails (never skips) with a clear message when the files are missing.
pub fn embedder_with(cfg: &EmbedConfig) -> Arc<Embedder> {
    if let Some(missing) = cfg.missing_file() {
        panic!(
            "the embedding model is not installed: {} is missing. Run deploy/local/models.sh \
             (or set COMPANION_MODEL_DIR / ORT_DYLIB_PATH).",
            missing.display()
        );
    }
    Embedder::load(cfg).expect("loading the embedder")
}

pub fn embedder() -> Arc<Embedder> {
    embedder_with(&embed_config())
}
