//! What the measured turns asked of NATS, per turn: the messages the run's workers sent to the server
//! (publishes, JetStream API requests, acks, direct gets) and received from it (deliveries, API replies,
//! notices), from the server's own per-connection counters (`/connz` of its monitoring endpoint,
//! `NATS_MONITOR_URL`). A worker's connection is told apart from the bench's own and from other runs' by
//! its subscriptions: it listens for its run's settled notices (`<subject prefix>.settled.>`), which no
//! other client of the server does.

use serde::Deserialize;

use super::BenchError;

/// The counters of the run's workers' connections at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Totals {
    sent: u64,
    received: u64,
}

/// The part of `/connz?subs=1` read here.
#[derive(Debug, Deserialize)]
struct Connz {
    connections: Vec<Conn>,
}

#[derive(Debug, Deserialize)]
struct Conn {
    /// Messages the client sent to the server.
    in_msgs: u64,
    /// Messages the server sent to the client.
    out_msgs: u64,
    #[serde(default)]
    subscriptions_list: Vec<String>,
}

/// NATS messages per measured turn, as [`Counter::finish`] reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct NatsWork {
    /// Sent by the workers to the server, per turn.
    pub sent_per_turn: f64,
    /// Received by the workers from the server, per turn.
    pub received_per_turn: f64,
    /// The run's worker connections found.
    pub connections: usize,
}

/// Counts the run's workers' NATS messages from [`Counter::start`] to [`Counter::finish`].
pub struct Counter {
    connz: String,
    marker: String,
    before: Totals,
}

impl Counter {
    /// Reads the counters now; `monitor` is the server's monitoring URL, the prefixes the run's.
    pub async fn start(monitor: &str, subject_prefix: &str) -> Result<Self, BenchError> {
        // reqwest is built without a default TLS provider; the worker installs this one too.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut counter = Self {
            connz: format!(
                "{}/connz?subs=1&limit=100000",
                monitor.trim_end_matches('/')
            ),
            marker: format!("{subject_prefix}.settled."),
            before: Totals::default(),
        };
        counter.before = counter.read().await?.0;
        Ok(counter)
    }

    /// The messages since the start, per turn of `turns`.
    pub async fn finish(&self, turns: usize) -> Result<NatsWork, BenchError> {
        let (now, connections) = self.read().await?;
        let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / turns.max(1) as f64;
        Ok(NatsWork {
            sent_per_turn: per(now.sent, self.before.sent),
            received_per_turn: per(now.received, self.before.received),
            connections,
        })
    }

    async fn read(&self) -> Result<(Totals, usize), BenchError> {
        let failed =
            |e: String| BenchError::Setup(format!("NATS monitoring ({}): {e}", self.connz));
        let connz: Connz = reqwest::get(&self.connz)
            .await
            .map_err(|e| failed(e.to_string()))?
            .error_for_status()
            .map_err(|e| failed(e.to_string()))?
            .json()
            .await
            .map_err(|e| failed(e.to_string()))?;
        Ok(totals(&connz, &self.marker))
    }
}

/// The counters summed over the connections one of whose subscriptions contains `marker`.
fn totals(connz: &Connz, marker: &str) -> (Totals, usize) {
    let mut t = Totals::default();
    let mut n = 0;
    for c in &connz.connections {
        let ours = c.subscriptions_list.iter().any(|s| s.contains(marker));
        if ours {
            t.sent += c.in_msgs;
            t.received += c.out_msgs;
            n += 1;
        }
    }
    (t, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_runs_worker_connections_are_counted() {
        let connz: Connz = serde_json::from_value(serde_json::json!({"connections": [
            // The bench's own collector.
            {"in_msgs": 50, "out_msgs": 90,
             "subscriptions_list": ["_INBOX.a.*", "benchx.dm.bot.out.>"]},
            // A worker of this run.
            {"in_msgs": 311, "out_msgs": 315,
             "subscriptions_list": ["_INBOX.b.*", "benchx.dm.bot.settled.>"]},
            // A worker of another run (a test beside the bench).
            {"in_msgs": 1000, "out_msgs": 1000,
             "subscriptions_list": ["t1.dm.bot.settled.>"]},
            // A second worker of this run.
            {"in_msgs": 7, "out_msgs": 5,
             "subscriptions_list": ["benchx.dm.bot.settled.>", "_INBOX.c.*"]},
        ]}))
        .unwrap();
        assert_eq!(
            totals(&connz, "benchx.dm.bot.settled."),
            (
                Totals {
                    sent: 318,
                    received: 320
                },
                2
            )
        );
    }
}
