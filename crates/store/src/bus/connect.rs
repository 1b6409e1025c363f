//! The first connection to NATS: what is wrong, named at the first failed attempt, then quiet retries.
//!
//! The client's error alone often does not say it (pointed at an HTTP port it reads `expected INFO, got
//! nothing`), so a failed attempt is diagnosed with a short raw TCP probe of the first server address:
//! a NATS server speaks first, with one `INFO {json}` line; anything else answering is not NATS (an
//! HTTP server is asked `GET /` and answers `HTTP/…`); a TLS record means the server wants TLS first.
//! The probe starts also while an attempt is still pending after half a second, so an address that is
//! plainly not NATS is named without waiting for the client's connect timeout.
//!
//! [`Bus::connect`](super::Bus::connect) logs the cause once, then tries again quietly within the
//! connect window: one line when the cause changes (with the attempts of the one before) and the
//! count of attempts in the final error.

use std::time::Duration;

use async_nats::{ConnectErrorKind, ServerAddr};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::config::NatsConfig;

/// Why the first connection to NATS failed, in the words an operator acts on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnectCause {
    /// `NATS_URL` names no server.
    #[error("no server address given")]
    NoAddress,
    /// `NATS_URL` does not parse.
    #[error("not a NATS server address ({0})")]
    BadAddress(String),
    /// The host name does not resolve.
    #[error("the host name does not resolve ({0})")]
    Unresolved(String),
    /// Nothing listens at the address.
    #[error("nothing listening (connection refused)")]
    NothingListening,
    /// The address cannot be reached (no route, or no TCP connection in time).
    #[error("unreachable ({0})")]
    Unreachable(String),
    /// Something answered, but not with NATS's `INFO`.
    #[error("not a NATS server: {answered}, where a NATS server sends INFO")]
    NotNats {
        /// What came back instead, e.g. an HTTP status line.
        answered: String,
    },
    /// Something took the connection and sent no `INFO`: not NATS, or a NATS server that wants TLS
    /// before anything else.
    #[error(
        "not a NATS server, or one that expects TLS first: it {what} (a NATS server sends INFO at \
         once; a server with `handshake_first` needs NATS_TLS_FIRST=true)"
    )]
    NoInfo {
        /// What it did: accepted the connection and sent nothing, or closed it.
        what: String,
    },
    /// The server wants TLS (or a client certificate) and this client is not set up for it.
    #[error("TLS expected: {0}")]
    TlsExpected(String),
    /// TLS is set up on both sides and the handshake failed.
    #[error("TLS handshake failed: {0}")]
    Tls(String),
    /// The server refused the credentials (or their absence): final, not retried.
    #[error("authorization refused{}: {detail}", user.as_deref().map(|u| format!(" for user {u}")).unwrap_or_default())]
    Unauthorized {
        /// `NATS_USER`, when one is set.
        user: Option<String>,
        /// The server's or the client's words.
        detail: String,
    },
    /// A NATS server answered, and the connection failed for another reason.
    #[error("a NATS server answered, then: {0}")]
    Other(String),
}

impl ConnectCause {
    /// Whether trying again cannot help: the address or the credentials are wrong.
    pub(crate) fn is_final(&self) -> bool {
        matches!(
            self,
            Self::NoAddress | Self::BadAddress(_) | Self::Unauthorized { .. }
        )
    }
}

/// What a raw TCP connection to the address showed.
#[derive(Debug)]
enum Probe {
    /// Connection refused.
    Refused,
    /// No TCP connection (another error, or none in time).
    Unreachable(String),
    /// A NATS server's `INFO`, its JSON.
    Info(serde_json::Value),
    /// Other bytes: the first that came (unasked, or after `GET /`).
    Answered(Vec<u8>),
    /// The connection was closed without a byte.
    Closed,
    /// The connection stayed open and silent, even after `GET /`.
    Silent,
}

/// How long the probe waits for a TCP connection, and for each answer.
const PROBE_WAIT: Duration = Duration::from_secs(1);
/// A pending attempt is probed alongside after this long.
const EARLY_PROBE_AFTER: Duration = Duration::from_millis(500);

/// Reads what arrives within `wait` into `buf`: `None` for nothing in time, `Some(0)` for a closed
/// connection. Stops at the first line end.
async fn read_some(stream: &mut TcpStream, buf: &mut Vec<u8>, wait: Duration) -> Option<usize> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut chunk = [0u8; 2048];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Err(_) => return (!buf.is_empty()).then_some(buf.len()),
            Ok(Err(_)) | Ok(Ok(0)) => return Some(buf.len()),
            Ok(Ok(n)) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.windows(2).any(|w| w == b"\r\n") || buf.len() >= 64 * 1024 {
                    return Some(buf.len());
                }
            }
        }
    }
}

/// Connects to `host:port` and reads what it says first; if it says nothing, asks `GET /`.
async fn probe(host: &str, port: u16) -> Probe {
    let mut stream = match tokio::time::timeout(PROBE_WAIT, TcpStream::connect((host, port))).await
    {
        Err(_) => return Probe::Unreachable(format!("no TCP connection within {PROBE_WAIT:?}")),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Probe::Refused,
        Ok(Err(e)) => return Probe::Unreachable(e.to_string()),
        Ok(Ok(s)) => s,
    };
    let mut buf = Vec::new();
    match read_some(&mut stream, &mut buf, PROBE_WAIT).await {
        Some(0) => return Probe::Closed,
        Some(_) => return parse_first(buf),
        None => {}
    }
    // Silent so far: an HTTP server answers a request, a TLS server sends an alert or hangs up.
    if stream.write_all(b"GET / HTTP/1.0\r\n\r\n").await.is_err() {
        return Probe::Closed;
    }
    match read_some(&mut stream, &mut buf, PROBE_WAIT).await {
        Some(0) => Probe::Closed,
        Some(_) => parse_first(buf),
        None => Probe::Silent,
    }
}

/// `INFO {json}` or other bytes.
fn parse_first(buf: Vec<u8>) -> Probe {
    if let Some(rest) = buf.strip_prefix(b"INFO ") {
        let line = rest.split(|&b| b == b'\r').next().unwrap_or_default();
        return Probe::Info(serde_json::from_slice(line).unwrap_or_default());
    }
    Probe::Answered(buf)
}

/// Whether this client offers TLS by itself (not only when the server asks).
fn tls_configured(config: &NatsConfig) -> bool {
    config.tls_required
        || config.tls_ca_file.is_some()
        || config.tls_cert_file.is_some()
        || config.tls_first
        || config.url.contains("tls://")
}

/// The first bytes as one short printable line.
fn shown(bytes: &[u8]) -> String {
    let line = bytes
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or_default();
    let text: String = String::from_utf8_lossy(line)
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(60)
        .collect();
    text
}

/// What other bytes than `INFO` say about the server; `None` when they say TLS (the caller decides).
fn answered(bytes: &[u8]) -> Option<String> {
    match bytes.first() {
        // A TLS record: alert or handshake.
        Some(0x15 | 0x16) => None,
        _ if bytes.starts_with(b"HTTP/") => Some(format!(
            "an HTTP server answered (`{}`; the monitoring port?)",
            shown(bytes)
        )),
        _ => Some(format!("it sent `{}`", shown(bytes))),
    }
}

/// The cause of a failed attempt, from the client's error and what the probe saw.
fn diagnose(
    config: &NatsConfig,
    kind: ConnectErrorKind,
    error: &str,
    probe: Probe,
) -> ConnectCause {
    let tls_first_hint = "the server answered with TLS: it expects TLS first (set NATS_TLS_FIRST=true and \
                          NATS_TLS_CA_FILE if its certificate is not from a public CA)";
    match probe {
        Probe::Refused => ConnectCause::NothingListening,
        Probe::Unreachable(e) => ConnectCause::Unreachable(e),
        Probe::Answered(bytes) => match answered(&bytes) {
            Some(answered) => ConnectCause::NotNats { answered },
            None if config.tls_first => ConnectCause::Tls(error.to_owned()),
            None => ConnectCause::TlsExpected(tls_first_hint.to_owned()),
        },
        Probe::Closed | Probe::Silent if config.tls_first => ConnectCause::Tls(error.to_owned()),
        Probe::Closed => ConnectCause::NoInfo {
            what: "closed the connection without a word".into(),
        },
        Probe::Silent => ConnectCause::NoInfo {
            what: "accepted the connection and sent nothing, not even to `GET /`".into(),
        },
        Probe::Info(info) => {
            let flag = |name: &str| info[name].as_bool().unwrap_or(false);
            if flag("tls_required") && !tls_configured(config) {
                ConnectCause::TlsExpected(format!(
                    "the server requires TLS (its INFO says tls_required) and none is configured \
                     (NATS_TLS_CA_FILE, NATS_TLS_REQUIRED or a tls:// URL); the handshake failed: {error}"
                ))
            } else if flag("tls_verify") && config.tls_cert_file.is_none() {
                ConnectCause::TlsExpected(format!(
                    "the server requires a client certificate (its INFO says tls_verify) and none is \
                     configured (NATS_TLS_CERT_FILE, NATS_TLS_KEY_FILE): {error}"
                ))
            } else if config.tls_first && !flag("tls_required") {
                ConnectCause::Tls(format!(
                    "NATS_TLS_FIRST is set, and the server sends INFO in plain text first (no \
                     `handshake_first`): {error}"
                ))
            } else if kind == ConnectErrorKind::Tls {
                ConnectCause::Tls(error.to_owned())
            } else {
                ConnectCause::Other(error.to_owned())
            }
        }
    }
}

/// One connect attempt: the client, or the cause of its failure. A pending attempt is probed
/// alongside; a probe that shows the address is plainly not NATS ends the attempt at once.
pub(super) async fn attempt(
    config: &NatsConfig,
    options: async_nats::ConnectOptions,
    servers: &[ServerAddr],
) -> Result<async_nats::Client, ConnectCause> {
    let first = servers.first().ok_or(ConnectCause::NoAddress)?;
    let (host, port) = (first.host().to_owned(), first.port());
    let connect = options.connect(servers.to_vec());
    tokio::pin!(connect);
    let early = async {
        tokio::time::sleep(EARLY_PROBE_AFTER).await;
        probe(&host, port).await
    };
    let (result, seen) = tokio::select! {
        result = &mut connect => (result, None),
        seen = early => match seen {
            Probe::Refused => return Err(ConnectCause::NothingListening),
            Probe::Answered(bytes) if answered(&bytes).is_some() && !config.tls_first => {
                return Err(diagnose(config, ConnectErrorKind::Io, "", Probe::Answered(bytes)));
            }
            seen => (connect.await, Some(seen)),
        },
    };
    let e = match result {
        Ok(client) => return Ok(client),
        Err(e) => e,
    };
    let kind = e.kind();
    let error = e.to_string();
    match kind {
        ConnectErrorKind::Authentication | ConnectErrorKind::AuthorizationViolation => {
            return Err(ConnectCause::Unauthorized {
                user: config.user.clone(),
                detail: error,
            });
        }
        ConnectErrorKind::ServerParse => return Err(ConnectCause::BadAddress(error)),
        ConnectErrorKind::Dns => return Err(ConnectCause::Unresolved(error)),
        _ => {}
    }
    let seen = match seen {
        Some(seen) => seen,
        None => probe(&host, port).await,
    };
    Err(diagnose(config, kind, &error, seen))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_bytes_name_what_answered() {
        assert!(
            answered(b"HTTP/1.1 200 OK\r\nContent-Type: text/html")
                .unwrap()
                .contains("an HTTP server answered (`HTTP/1.1 200 OK`")
        );
        assert_eq!(answered(&[0x15, 0x03, 0x03, 0x00, 0x02]), None);
        assert_eq!(answered(b"+OK\r\n").unwrap(), "it sent `+OK`");
        match parse_first(b"INFO {\"tls_required\":true}\r\n".to_vec()) {
            Probe::Info(info) => assert_eq!(info["tls_required"], true),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refused_credentials_and_bad_addresses_are_final() {
        let refused = ConnectCause::Unauthorized {
            user: Some("jess".into()),
            detail: "authorization violation".into(),
        };
        assert!(refused.is_final());
        assert_eq!(
            refused.to_string(),
            "authorization refused for user jess: authorization violation"
        );
        assert!(!ConnectCause::NothingListening.is_final());
        assert!(ConnectCause::BadAddress("x".into()).is_final());
    }
}
