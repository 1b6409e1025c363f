//! The environment that gives a child process (a worker the bench or a test starts) exactly a
//! configuration. Every setting is listed, so a flag given to the parent is never lost on the way; a
//! test checks that against the settings' definitions.

use std::path::Path;

use companion_core::config::{Config, ExposeSecret, LogFormat};

/// `key=value` pairs for a child process's environment.
pub type Env = Vec<(&'static str, String)>;

/// Every setting of `c`, as the environment.
pub fn of(c: &Config) -> Env {
    let mut env = Env::new();
    // Unset: the encoder's own.
    let thresholds = [
        ("COMPANION_RAG_THRESHOLD", c.rag.threshold),
        ("COMPANION_MEMORY_THRESHOLD", c.memory.threshold),
    ];
    env.extend(
        thresholds
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?.to_string()))),
    );
    env.extend(servers(c));
    env.extend(model(c));
    env.extend(characters(c));
    env.extend(safety(c));
    env.extend(prompt(c));
    env.extend(memory(c));
    env.extend(turn(c));
    env.extend(spend(c));
    env.extend(groups_flows_follow_ups(c));
    env.extend(worker(c));
    env.extend(retrieval(c));
    env.extend(telemetry(c));
    env
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

fn log_format(f: LogFormat) -> String {
    match f {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    }
    .to_owned()
}

/// NATS, the consumer, MongoDB and PostgreSQL.
fn servers(c: &Config) -> Env {
    let n = &c.nats;
    let mut env = vec![
        ("NATS_URL", c.nats.url.clone()),
        ("NATS_PASSWORD", c.nats.password.expose_secret().to_owned()),
        ("NATS_TLS_REQUIRED", c.nats.tls_required.to_string()),
        ("NATS_TLS_FIRST", c.nats.tls_first.to_string()),
        ("COMPANION_SUBJECT_PREFIX", c.nats.subject_prefix.clone()),
        ("COMPANION_STREAM_PREFIX", c.nats.stream_prefix.clone()),
        (
            "COMPANION_STREAM_REPLICAS",
            c.nats.stream_replicas.to_string(),
        ),
        (
            "NATS_CONNECT_WINDOW_SECS",
            c.nats.connect_window_secs.to_string(),
        ),
        ("COMPANION_CONSUMER", c.consumer.name.clone()),
        ("COMPANION_MAX_DELIVER", c.consumer.max_deliver.to_string()),
        (
            "COMPANION_ACK_WAIT_SECS",
            c.consumer.ack_wait_secs.to_string(),
        ),
        (
            "COMPANION_MAX_ACK_PENDING",
            c.consumer.max_ack_pending.to_string(),
        ),
        ("ATLAS_URI", c.mongo.uri.clone()),
        ("POSTGRES_URL", c.pg.url.clone()),
        ("POSTGRES_POOL_SIZE", c.pg.pool_size.to_string()),
    ];
    let optional = [
        ("NATS_USER", n.user.clone()),
        ("NATS_TLS_CA_FILE", n.tls_ca_file.as_deref().map(path)),
        ("NATS_TLS_CERT_FILE", n.tls_cert_file.as_deref().map(path)),
        ("NATS_TLS_KEY_FILE", n.tls_key_file.as_deref().map(path)),
    ];
    env.extend(optional.into_iter().filter_map(|(k, v)| Some((k, v?))));
    env
}

/// The model API.
fn model(c: &Config) -> Env {
    vec![
        (
            "OPENROUTER_API_KEY",
            c.llm.api_key.expose_secret().to_owned(),
        ),
        ("OPENROUTER_MODEL", c.llm.model.clone()),
        ("LLM_BASE_URL", c.llm.base_url.clone()),
        ("LLM_TIMEOUT_SECS", c.llm.timeout_secs.to_string()),
        ("LLM_MAX_TOKENS", c.llm.max_tokens.to_string()),
        ("LLM_TEMPERATURE", c.llm.temperature.to_string()),
        ("LLM_MAX_RETRIES", c.llm.max_retries.to_string()),
        ("LLM_RETRY_BASE_MS", c.llm.retry_base_ms.to_string()),
        ("LLM_RETRY_MAX_SECS", c.llm.retry_max_secs.to_string()),
        ("LLM_FALLBACK_MODELS", c.llm.fallback_models.join(",")),
        (
            "LLM_REQUESTS_PER_SECOND",
            c.llm.requests_per_second.to_string(),
        ),
        ("LLM_PRICES", c.llm.prices.clone()),
        (
            "LLM_MAX_RESPONSE_BYTES",
            c.llm.max_response_bytes.to_string(),
        ),
    ]
}

/// Characters and their flows.
fn characters(c: &Config) -> Env {
    vec![
        ("COMPANION_CHARACTERS_DIR", path(&c.characters.dir)),
        ("COMPANION_FLOWS_DIR", path(&c.characters.flows_dir)),
    ]
}

/// Safety for people.
fn safety(c: &Config) -> Env {
    vec![
        (
            "COMPANION_CRISIS_LINES_FILE",
            c.safety.crisis_lines_file.clone(),
        ),
        (
            "COMPANION_AI_DISCLOSURE",
            c.safety.ai_disclosure.to_string(),
        ),
        (
            "COMPANION_CRISIS_REFERRAL_WINDOW_SECS",
            c.safety.crisis_referral_window_secs.to_string(),
        ),
        (
            "COMPANION_CRISIS_LINES_REVIEW_DAYS",
            c.safety.crisis_lines_review_days.to_string(),
        ),
        (
            "COMPANION_SCREEN_LEARNED",
            c.safety.screen_learned.to_string(),
        ),
        ("COMPANION_MODERATION_URL", c.safety.moderation_url.clone()),
        (
            "COMPANION_MODERATION_API_KEY",
            c.safety.moderation_api_key.expose_secret().to_owned(),
        ),
        (
            "COMPANION_MODERATION_MODEL",
            c.safety.moderation_model.clone(),
        ),
        (
            "COMPANION_MODERATION_TIMEOUT_MS",
            c.safety.moderation_timeout_ms.to_string(),
        ),
        (
            "COMPANION_DISCLOSURE_EVERY_SECS",
            c.safety.disclosure_every_secs.to_string(),
        ),
        (
            "COMPANION_DISCLOSURE_GAP_SECS",
            c.safety.disclosure_gap_secs.to_string(),
        ),
        (
            "COMPANION_AGE_FIELD_IS_MINOR",
            c.safety.field_is_minor.clone(),
        ),
        (
            "COMPANION_AGE_FIELD_BRACKET",
            c.safety.field_age_bracket.clone(),
        ),
        (
            "COMPANION_AGE_FIELD_BIRTHDATE",
            c.safety.field_birthdate.clone(),
        ),
        (
            "COMPANION_UNKNOWN_AGE_IS_MINOR",
            c.safety.unknown_age_is_minor.to_string(),
        ),
        (
            "COMPANION_MINOR_QUIET_START",
            c.safety.minor_quiet_start.format("%H:%M").to_string(),
        ),
        (
            "COMPANION_MINOR_QUIET_END",
            c.safety.minor_quiet_end.format("%H:%M").to_string(),
        ),
        ("COMPANION_UNDER_13_LINE", c.safety.under_13_line.clone()),
    ]
}

/// The prompt budget.
fn prompt(c: &Config) -> Env {
    vec![
        (
            "COMPANION_PROMPT_MAX_TOKENS",
            c.prompt.max_tokens.to_string(),
        ),
        (
            "COMPANION_PROMPT_CHARACTER_TOKENS",
            c.prompt.character_tokens.to_string(),
        ),
        (
            "COMPANION_PROMPT_RULES_TOKENS",
            c.prompt.rules_tokens.to_string(),
        ),
        (
            "COMPANION_PROMPT_USER_TOKENS",
            c.prompt.user_tokens.to_string(),
        ),
        (
            "COMPANION_PROMPT_KNOWLEDGE_TOKENS",
            c.prompt.knowledge_tokens.to_string(),
        ),
        (
            "COMPANION_PROMPT_FLOW_TOKENS",
            c.prompt.flow_tokens.to_string(),
        ),
        (
            "COMPANION_PROMPT_HISTORY_TOKENS",
            c.prompt.history_tokens.to_string(),
        ),
        (
            "COMPANION_PROMPT_HISTORY_STEP",
            c.prompt.history_step.to_string(),
        ),
        (
            "COMPANION_PROMPT_TOOLS_BY_TURN",
            c.prompt.tools_by_turn.to_string(),
        ),
        (
            "COMPANION_PROMPT_MEMORY_TOKENS",
            c.prompt.memory_tokens.to_string(),
        ),
        (
            "COMPANION_PROMPT_SUMMARY_TOKENS",
            c.prompt.summary_tokens.to_string(),
        ),
    ]
}

/// Long-term memory.
fn memory(c: &Config) -> Env {
    vec![
        ("COMPANION_MEMORY", c.memory.enabled.to_string()),
        (
            "COMPANION_MEMORY_EXTRACT_AFTER",
            c.memory.extract_after.to_string(),
        ),
        (
            "COMPANION_MEMORY_QUIET_SECS",
            c.memory.quiet_secs.to_string(),
        ),
        ("COMPANION_MEMORY_BATCH_MAX", c.memory.batch_max.to_string()),
        ("COMPANION_MEMORY_MODEL", c.memory.model.clone()),
        ("COMPANION_MEMORY_TOP_K", c.memory.top_k.to_string()),
        (
            "COMPANION_MEMORY_REMEMBER_PER_DAY",
            c.memory.remember_per_day.to_string(),
        ),
        ("COMPANION_MEMORY_MAX_FACTS", c.memory.max_facts.to_string()),
        (
            "COMPANION_MEMORY_SUMMARY_AFTER",
            c.memory.summary_after.to_string(),
        ),
    ]
}

/// Turns: input bounds, tools, limits.
fn turn(c: &Config) -> Env {
    vec![
        (
            "COMPANION_MAX_EVENT_BYTES",
            c.turn.max_event_bytes.to_string(),
        ),
        (
            "COMPANION_MAX_CONTENT_CHARS",
            c.turn.max_content_chars.to_string(),
        ),
        ("COMPANION_HISTORY_LIMIT", c.turn.history_limit.to_string()),
        (
            "COMPANION_MAX_TOOL_ROUNDS",
            c.turn.max_tool_rounds.to_string(),
        ),
        (
            "COMPANION_TURN_TIMEOUT_SECS",
            c.turn.turn_timeout_secs.to_string(),
        ),
        (
            "COMPANION_MAX_TOOL_RESULT_BYTES",
            c.turn.max_tool_result_bytes.to_string(),
        ),
        (
            "COMPANION_WRITES_PER_HOUR",
            c.turn.writes_per_hour.to_string(),
        ),
        (
            "COMPANION_MAX_REPLY_CHARS",
            c.turn.max_reply_chars.to_string(),
        ),
        ("COMPANION_BURST_MAX", c.turn.burst_max.to_string()),
        (
            "COMPANION_USER_TURNS_PER_MINUTE",
            c.turn.user_turns_per_minute.to_string(),
        ),
        (
            "COMPANION_REMINDER_MIN_LEAD_SECS",
            c.turn.reminder_min_lead_secs.to_string(),
        ),
        (
            "COMPANION_MAX_LLM_CALLS_PER_TURN",
            c.turn.max_llm_calls_per_turn.to_string(),
        ),
    ]
}

/// The spend budgets.
fn spend(c: &Config) -> Env {
    vec![
        (
            "COMPANION_MAX_PROMPT_TOKENS_PER_TURN",
            c.spend.max_prompt_tokens_per_turn.to_string(),
        ),
        (
            "COMPANION_USER_DAILY_TOKENS",
            c.spend.user_daily_tokens.to_string(),
        ),
        (
            "COMPANION_USER_DAILY_USD",
            c.spend.user_daily_usd.to_string(),
        ),
        (
            "COMPANION_SERVICE_DAILY_TOKENS",
            c.spend.service_daily_tokens.to_string(),
        ),
        (
            "COMPANION_SERVICE_DAILY_USD",
            c.spend.service_daily_usd.to_string(),
        ),
        (
            "COMPANION_BUDGET_WINDOW_SECS",
            c.spend.budget_window_secs.to_string(),
        ),
        (
            "COMPANION_BUDGET_CHEAPER_AT",
            c.spend.budget_cheaper_at.to_string(),
        ),
        ("COMPANION_BUDGET_MODEL", c.spend.budget_model.clone()),
        (
            "COMPANION_SERVICE_SPEND_REFRESH_SECS",
            c.spend.service_spend_refresh_secs.to_string(),
        ),
    ]
}

/// Group chats, guided flows and follow-ups.
fn groups_flows_follow_ups(c: &Config) -> Env {
    vec![
        (
            "COMPANION_GROUP_MAX_HANDOVERS",
            c.group.max_handovers.to_string(),
        ),
        (
            "COMPANION_GROUP_MAX_MESSAGES",
            c.group.max_messages.to_string(),
        ),
        ("COMPANION_GROUP_FIT_MARGIN", c.group.fit_margin.to_string()),
        ("COMPANION_FLOW_IDLE_DAYS", c.flow.idle_days.to_string()),
        (
            "COMPANION_PROACTIVE_DAILY_CAP",
            c.follow_ups.daily_cap.to_string(),
        ),
    ]
}

/// The worker process.
fn worker(c: &Config) -> Env {
    vec![
        ("COMPANION_CONCURRENCY", c.worker.concurrency.to_string()),
        (
            "COMPANION_SIGNAL_CONCURRENCY",
            c.worker.signal_concurrency.to_string(),
        ),
        (
            "COMPANION_RETRY_DELAY_SECS",
            c.worker.retry_delay_secs.to_string(),
        ),
        (
            "COMPANION_SHUTDOWN_GRACE_SECS",
            c.worker.shutdown_grace_secs.to_string(),
        ),
        (
            "COMPANION_ORDER_MAX_WAIT_SECS",
            c.worker.order_max_wait_secs.to_string(),
        ),
        (
            "COMPANION_OUTAGE_MAX_SECS",
            c.worker.outage_max_secs.to_string(),
        ),
        ("COMPANION_HTTP_ADDR", c.worker.http_addr.clone()),
        (
            "COMPANION_RUNTIME_THREADS",
            c.worker.runtime_threads.to_string(),
        ),
    ]
}

/// Embedding and retrieval.
fn retrieval(c: &Config) -> Env {
    vec![
        ("COMPANION_MODEL_DIR", path(&c.embed.model_dir)),
        ("COMPANION_ENCODER", c.embed.encoder.clone()),
        ("COMPANION_EMBED_MODEL", c.embed.model_file.clone()),
        ("ORT_DYLIB_PATH", path(&c.embed.ort_dylib_path)),
        ("COMPANION_EMBED_THREADS", c.embed.threads.to_string()),
        ("COMPANION_EMBED_MAX_BATCH", c.embed.max_batch.to_string()),
        ("COMPANION_EMBED_WINDOW_MS", c.embed.window_ms.to_string()),
        ("COMPANION_RAG_TOP_K", c.rag.top_k.to_string()),
        ("COMPANION_RAG_QUERY_CACHE", c.rag.query_cache.to_string()),
        (
            "COMPANION_RAG_SKIP_CONTENTLESS",
            c.rag.skip_contentless.to_string(),
        ),
        ("COMPANION_CHUNK_TOKENS", c.rag.chunk_tokens.to_string()),
        ("COMPANION_CHUNK_OVERLAP", c.rag.chunk_overlap.to_string()),
    ]
}

/// Logs and traces.
fn telemetry(c: &Config) -> Env {
    vec![
        ("LOG_FORMAT", log_format(c.log.format)),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", c.log.otel_endpoint.clone()),
        ("OTEL_SERVICE_NAME", c.log.otel_service_name.clone()),
        ("COMPANION_TRACE_CONTENT", c.log.trace_content.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use companion_core::config::LogConfig;

    /// `of` lists every setting, and what it lists reads back as the same configuration.
    #[test]
    fn the_environment_of_a_child_process_carries_every_setting() {
        use clap::{CommandFactory, Parser};
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            config: Config,
            #[command(flatten)]
            log: LogConfig,
        }
        let mut config = Config::from_env().unwrap();
        config.nats.user = Some("worker".into());
        config.nats.tls_ca_file = Some("/etc/ca.pem".into());
        config.nats.tls_required = true;
        config.llm.fallback_models = vec!["a/b".into(), "c/d".into()];
        config.turn.burst_max = 3;
        config.rag.threshold = Some(0.375);
        config.log.format = LogFormat::Json;
        config.llm.prices = "m/one=0.1:0.4,m/two=1:2".into();
        let env = of(&config);
        let command = Wrapper::command();
        let mut args = vec!["companion".to_owned()];
        for arg in command.get_arguments() {
            let Some(name) = arg.get_env().and_then(|e| e.to_str()) else {
                continue;
            };
            let listed = env.iter().find(|(k, _)| *k == name);
            let optional = [
                "COMPANION_MEMORY_THRESHOLD",
                "NATS_USER",
                "NATS_TLS_CA_FILE",
                "NATS_TLS_CERT_FILE",
                "NATS_TLS_KEY_FILE",
            ];
            assert!(
                listed.is_some() || optional.contains(&name),
                "{name} is missing from child_env::of"
            );
            if let Some((_, v)) = listed {
                args.push(format!("--{}={v}", arg.get_long().unwrap()));
            }
        }
        let back = Wrapper::try_parse_from(args).unwrap();
        let back = Config {
            log: back.log,
            ..back.config
        };
        assert_eq!(format!("{back:?}"), format!("{config:?}"));
        assert_eq!(
            back.nats.password.expose_secret(),
            config.nats.password.expose_secret()
        );
    }
}
