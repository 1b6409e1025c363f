//! `--count-round-trips`: a proxy between the bench's workers and PostgreSQL that counts round trips,
//! the client requests the server answers: each simple query (`Q`) and each `Sync` (`S`) that ends an
//! extended-protocol batch (a prepared statement's Parse/Bind/Execute, and the empty batch with which
//! sqlx's pool checks a connection before handing it out). Bytes go through unchanged; the proxy only
//! reads the client's message headers. It speaks plain TCP: the proxied URL says `sslmode=disable`.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

/// The untyped first messages a client may send before its startup message.
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

/// The running proxy.
pub struct PgWireCounter {
    pub addr: SocketAddr,
    round_trips: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl PgWireCounter {
    /// Listens on a free loopback port and forwards each connection to `upstream` (`host:port`).
    pub async fn start(upstream: String) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let round_trips = Arc::new(AtomicU64::new(0));
        let counted = round_trips.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, counted) = (upstream.clone(), counted.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        let _ = pipe(client, server, counted).await;
                    }
                });
            }
        });
        Ok(Self {
            addr,
            round_trips,
            task,
        })
    }

    /// Round trips since the start or the last [`PgWireCounter::reset`].
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    pub fn reset(&self) {
        self.round_trips.store(0, Ordering::Relaxed);
    }

    /// `url` (`postgres://user:pass@host:port/db?…`) through this proxy, without TLS.
    pub fn url(&self, url: &str) -> String {
        proxied_url(self.addr, url)
    }
}

/// `url` with its host and port replaced by `addr`, and `sslmode=disable`.
fn proxied_url(addr: SocketAddr, url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let (creds, after_at) = rest
        .rsplit_once('@')
        .map(|(c, a)| (format!("{c}@"), a))
        .unwrap_or((String::new(), rest));
    let path = after_at
        .find(['/', '?'])
        .map(|i| &after_at[i..])
        .unwrap_or("");
    let sep = if path.contains('?') { '&' } else { '?' };
    format!("{scheme}://{creds}{addr}{path}{sep}sslmode=disable")
}

impl Drop for PgWireCounter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies both ways; the client's side through a [`Frames`] reader.
async fn pipe(
    client: TcpStream,
    server: TcpStream,
    counted: Arc<AtomicU64>,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let down = tokio::spawn(async move { tokio::io::copy(&mut sr, &mut cw).await });
    let mut frames = Frames::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = cr.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        sw.write_all(&buf[..n]).await?;
        counted.fetch_add(frames.feed(&buf[..n]), Ordering::Relaxed);
    }
    let _ = sw.shutdown().await;
    down.abort();
    Ok(())
}

/// The client's message framing: untyped messages (length, code) until the startup message, then typed
/// ones (type byte, length). Counts the round trips in what it is fed.
#[derive(Debug)]
struct Frames {
    startup: bool,
    header: Vec<u8>,
    skip: usize,
}

impl Default for Frames {
    fn default() -> Self {
        Self {
            startup: true,
            header: Vec::with_capacity(8),
            skip: 0,
        }
    }
}

impl Frames {
    /// Reads `data` (the next bytes the client sent); the round trips it completed.
    fn feed(&mut self, mut data: &[u8]) -> u64 {
        let mut trips = 0;
        while !data.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(data.len());
                self.skip -= n;
                data = &data[n..];
                continue;
            }
            let need = if self.startup { 8 } else { 5 };
            let n = (need - self.header.len()).min(data.len());
            self.header.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.header.len() < need {
                break;
            }
            let h = std::mem::take(&mut self.header);
            if self.startup {
                let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
                let code = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
                self.skip = len.saturating_sub(8);
                self.startup = matches!(code, SSL_REQUEST | GSSENC_REQUEST);
            } else {
                let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
                self.skip = len.saturating_sub(4);
                if matches!(h[0], b'Q' | b'S') {
                    trips += 1;
                }
            }
        }
        trips
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(t: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![t];
        m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn untyped(code: u32, body: &[u8]) -> Vec<u8> {
        let mut m = ((body.len() + 8) as u32).to_be_bytes().to_vec();
        m.extend_from_slice(&code.to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn queries_and_syncs_are_counted_whatever_the_chunks() {
        let mut wire = untyped(SSL_REQUEST, b"");
        wire.extend(untyped(196_608, b"user\0companion\0\0"));
        wire.extend(typed(b'p', b"password"));
        wire.extend(typed(b'Q', b"BEGIN\0"));
        wire.extend(typed(b'P', b"\0SELECT 1\0\0\0"));
        wire.extend(typed(b'B', &[0; 10]));
        wire.extend(typed(b'E', &[0; 5]));
        wire.extend(typed(b'S', b""));
        wire.extend(typed(b'S', b""));
        wire.extend(typed(b'Q', b"COMMIT\0"));
        // A Q or an S inside a body is not a message.
        wire.extend(typed(b'd', b"QSQSQS"));
        for chunk in [1, 2, 3, 7, 64, wire.len()] {
            let mut frames = Frames::default();
            let trips: u64 = wire.chunks(chunk).map(|c| frames.feed(c)).sum();
            assert_eq!(trips, 4, "chunks of {chunk}");
        }
    }

    #[test]
    fn the_proxied_url_points_at_the_proxy_without_tls() {
        let addr: SocketAddr = "127.0.0.1:15999".parse().unwrap();
        assert_eq!(
            proxied_url(addr, "postgres://a:b@db:5432/bench_x"),
            "postgres://a:b@127.0.0.1:15999/bench_x?sslmode=disable"
        );
        assert_eq!(
            proxied_url(addr, "postgres://a:b@db/x?application_name=w"),
            "postgres://a:b@127.0.0.1:15999/x?application_name=w&sslmode=disable"
        );
    }
}
