//! The PostgreSQL connection pool: sqlx's pool without its check on every release.
//!
//! sqlx's `Pool` sends a `Sync` and waits for the server's answer each time a connection goes back
//! (`PoolConnection::return_to_pool` in sqlx-core 0.9, with no setting to skip it): one round trip for
//! every statement outside a transaction, half of a turn's round trips, and a backend wake-up each
//! (docs/benchmark.md, "PostgreSQL per turn"). This pool hands a statement that ended well its connection
//! back without that round trip. Everything else keeps sqlx's care:
//! - a statement that failed or was cancelled, and every explicit [`Lease`] (a transaction may have left a
//!   rollback queued), is checked (a `Sync`) before its connection is reused, and closed if the check fails;
//! - a connection idle [`PoolSettings::check_idle_after`] or longer is checked before it is handed out (after an outage,
//!   a restart or a failover the idle ones are dead);
//! - a connection idle longer than [`PoolSettings::idle_timeout`] or older than
//!   [`PoolSettings::max_lifetime`] is closed;
//! - at most [`PoolSettings::max_connections`] are open or being opened, and a caller waits at most
//!   [`PoolSettings::acquire_timeout`] for one (then `PoolTimedOut`, a transient error).
//!
//! A connection handed back with an answer still unread (a `fetch_optional` that stopped at the first
//! row) is drained by sqlx itself before its next statement (`wait_until_ready`).

use std::collections::VecDeque;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use sqlx::postgres::{PgConnectOptions, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{ConnectOptions, Connection, Either, Execute, PgConnection, Postgres};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The pool's bounds.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    /// Connections open (idle or lent) at most.
    pub max_connections: u32,
    /// How long a caller waits for a connection before `PoolTimedOut`.
    pub acquire_timeout: Duration,
    /// A connection idle this long is checked (a `Sync`, one round trip) before it is handed out: after
    /// an outage, a restart or a failover the idle ones are dead, and a dead one is dropped for another.
    /// One in steady use is not checked.
    pub check_idle_after: Duration,
    /// An idle connection unused this long is closed (sqlx's default).
    pub idle_timeout: Duration,
    /// A connection this old is closed when it comes back or is next picked (sqlx's default).
    pub max_lifetime: Duration,
}

impl PoolSettings {
    pub fn new(max_connections: u32) -> Self {
        Self {
            max_connections: max_connections.max(1),
            acquire_timeout: Duration::from_secs(5),
            check_idle_after: Duration::from_millis(500),
            idle_timeout: Duration::from_secs(600),
            max_lifetime: Duration::from_secs(1800),
        }
    }
}

/// A pool of PostgreSQL connections; `&Pool` runs a statement like sqlx's `&PgPool` does.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    options: PgConnectOptions,
    settings: PoolSettings,
    /// Connections not lent, the most recently used last (handed out first: the others age out).
    idle: Mutex<VecDeque<Idle>>,
    /// One per connection lent or being opened.
    permits: Arc<Semaphore>,
    closed: AtomicBool,
}

struct Idle {
    conn: PgConnection,
    since: Instant,
    born: Instant,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("settings", &self.inner.settings)
            .field("idle", &self.num_idle())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// Opens one connection now, so that a wrong address, password or database shows at once (the
    /// driver's own error, not a timeout).
    pub async fn connect(
        options: PgConnectOptions,
        settings: PoolSettings,
    ) -> Result<Self, sqlx::Error> {
        let conn = options.connect().await?;
        let pool = Self {
            inner: Arc::new(Inner {
                permits: Arc::new(Semaphore::new(settings.max_connections as usize)),
                options,
                settings,
                idle: Mutex::new(VecDeque::new()),
                closed: AtomicBool::new(false),
            }),
        };
        pool.inner.put_back(Idle {
            conn,
            since: Instant::now(),
            born: Instant::now(),
        });
        Ok(pool)
    }

    /// A connection of one's own until the lease is dropped (a transaction, several statements); it is
    /// checked before its next use.
    pub async fn lease(&self) -> Result<Lease, sqlx::Error> {
        if self.is_closed() {
            return Err(sqlx::Error::PoolClosed);
        }
        let timeout = self.inner.settings.acquire_timeout;
        match tokio::time::timeout(timeout, self.inner.clone().take()).await {
            Ok(taken) => taken,
            Err(_) => Err(sqlx::Error::PoolTimedOut),
        }
    }

    /// A transaction on a connection of its own: committed by [`Tx::commit`], else rolled back.
    pub async fn begin(&self) -> Result<Tx, sqlx::Error> {
        let mut lease = self.lease().await?;
        sqlx::Executor::execute(&mut *lease, "BEGIN").await?;
        Ok(Tx {
            lease: Some(lease),
            open: true,
        })
    }

    /// Whether [`Pool::close`] was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// Idle connections now.
    pub fn num_idle(&self) -> usize {
        self.inner.idle.lock().map(|i| i.len()).unwrap_or(0)
    }

    /// Closes the idle connections and refuses new leases; lent ones close when they come back.
    #[cfg(feature = "testing")]
    pub async fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.permits.close();
        let idle: Vec<Idle> = match self.inner.idle.lock() {
            Ok(mut i) => i.drain(..).collect(),
            Err(_) => Vec::new(),
        };
        for i in idle {
            let _ = i.conn.close().await;
        }
    }
}

impl Inner {
    /// Waits for a permit, then hands out the most recently used idle connection that is still good, or
    /// opens one.
    async fn take(self: Arc<Self>) -> Result<Lease, sqlx::Error> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        loop {
            let Some(mut idle) = self.idle.lock().ok().and_then(|mut i| i.pop_back()) else {
                break;
            };
            if self.expired(&idle) {
                close_later(idle.conn);
                continue;
            }
            if idle.since.elapsed() >= self.settings.check_idle_after
                && idle.conn.ping().await.is_err()
            {
                continue;
            }
            return Ok(Lease::new(idle.conn, idle.born, permit, self));
        }
        let conn = self.open().await?;
        Ok(Lease::new(conn, Instant::now(), permit, self))
    }

    /// Opens a connection; a refused or broken connection is tried again (10 ms, doubling to 1 s) until
    /// the caller's acquire timeout, as sqlx's pool does; an error of the server (authentication, a
    /// missing database) is returned at once.
    async fn open(&self) -> Result<PgConnection, sqlx::Error> {
        let mut wait = Duration::from_millis(10);
        loop {
            match self.options.connect().await {
                Ok(conn) => return Ok(conn),
                Err(e @ (sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_))) => {
                    tracing::debug!(error = %e, "opening a PostgreSQL connection failed; trying again");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn expired(&self, idle: &Idle) -> bool {
        idle.since.elapsed() > self.settings.idle_timeout
            || idle.born.elapsed() > self.settings.max_lifetime
    }

    /// Keeps a good connection for the next caller, closing those unused for too long.
    fn put_back(&self, idle: Idle) {
        if self.closed.load(Ordering::Acquire) || idle.born.elapsed() > self.settings.max_lifetime {
            close_later(idle.conn);
            return;
        }
        let Ok(mut queue) = self.idle.lock() else {
            return;
        };
        queue.push_back(idle);
        while queue.front().is_some_and(|i| self.expired(i)) {
            if let Some(old) = queue.pop_front() {
                close_later(old.conn);
            }
        }
    }
}

/// Closes a connection politely off the caller's path (a `Terminate`), or just drops it outside a runtime.
fn close_later(conn: PgConnection) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            let _ = conn.close().await;
        });
    }
}

/// A connection lent by the [`Pool`]; it goes back when dropped.
pub struct Lease {
    conn: Option<PgConnection>,
    born: Instant,
    /// Set once a single statement ended well: the connection goes back without a check.
    clean: bool,
    permit: Option<OwnedSemaphorePermit>,
    pool: Arc<Inner>,
}

impl Lease {
    fn new(
        conn: PgConnection,
        born: Instant,
        permit: OwnedSemaphorePermit,
        pool: Arc<Inner>,
    ) -> Self {
        Self {
            conn: Some(conn),
            born,
            clean: false,
            permit: Some(permit),
            pool,
        }
    }
}

impl Deref for Lease {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn
            .as_ref()
            .expect("a lease holds its connection until dropped")
    }
}

impl DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("a lease holds its connection until dropped")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let (Some(mut conn), Some(permit)) = (self.conn.take(), self.permit.take()) else {
            return;
        };
        let pool = self.pool.clone();
        let born = self.born;
        if self.clean {
            pool.put_back(Idle {
                conn,
                since: Instant::now(),
                born,
            });
            drop(permit);
            return;
        }
        // What sqlx does for every connection: check it (flushing a queued rollback) before reuse.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            match conn.ping().await {
                Ok(()) => pool.put_back(Idle {
                    conn,
                    since: Instant::now(),
                    born,
                }),
                Err(error) => {
                    tracing::warn!(%error, "a PostgreSQL connection failed its check on release; closed");
                }
            }
            drop(permit);
        });
    }
}

/// A transaction begun by [`Pool::begin`]; `&mut *tx` runs statements in it. Dropped before
/// [`Tx::commit`] or [`Tx::rollback`], it is rolled back off the caller's path before its connection is
/// reused.
pub struct Tx {
    lease: Option<Lease>,
    /// BEGIN sent and neither COMMIT nor ROLLBACK since.
    open: bool,
}

impl Tx {
    pub async fn commit(mut self) -> Result<(), sqlx::Error> {
        self.end("COMMIT").await
    }

    pub async fn rollback(mut self) -> Result<(), sqlx::Error> {
        self.end("ROLLBACK").await
    }

    async fn end(&mut self, sql: &'static str) -> Result<(), sqlx::Error> {
        let lease = self
            .lease
            .as_mut()
            .expect("a transaction holds its lease until dropped");
        sqlx::Executor::execute(&mut **lease, sql).await?;
        self.open = false;
        lease.clean = true;
        Ok(())
    }
}

impl Deref for Tx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.lease
            .as_ref()
            .expect("a transaction holds its lease until dropped")
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.lease
            .as_mut()
            .expect("a transaction holds its lease until dropped")
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        let Some(mut lease) = self.lease.take() else {
            return;
        };
        if !self.open {
            return;
        }
        lease.clean = false;
        // Without a runtime the connection is just dropped: the server rolls back when it closes.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = sqlx::Executor::execute(&mut *lease, "ROLLBACK").await;
            });
        } else if let Some(conn) = lease.conn.take() {
            drop(conn);
        }
    }
}

// `describe` exists while sqlx-core's `offline` feature is on, which the workspace's `macros` feature
// (`sqlx::migrate!`) turns on.
impl<'p> sqlx::Executor<'p> for &'_ Pool {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let pool = self.clone();
        // Read to the end before the connection goes back (nothing here streams a large result).
        futures::stream::once(async move {
            let mut lease = pool.lease().await?;
            let items: Vec<_> = (&mut *lease).fetch_many(query).collect().await;
            lease.clean = items.iter().all(Result::is_ok);
            Ok::<_, sqlx::Error>(futures::stream::iter(items))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let pool = self.clone();
        Box::pin(async move {
            let mut lease = pool.lease().await?;
            let out = (&mut *lease).fetch_optional(query).await;
            lease.clean = out.is_ok();
            out
        })
    }

    fn prepare_with<'e>(
        self,
        sql: sqlx::SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'p: 'e,
    {
        let pool = self.clone();
        Box::pin(async move {
            let mut lease = pool.lease().await?;
            let out = (&mut *lease).prepare_with(sql, parameters).await;
            lease.clean = out.is_ok();
            out
        })
    }

    fn describe<'e>(
        self,
        sql: sqlx::SqlStr,
    ) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'p: 'e,
    {
        let pool = self.clone();
        Box::pin(async move {
            let mut lease = pool.lease().await?;
            let out = (&mut *lease).describe(sql).await;
            lease.clean = out.is_ok();
            out
        })
    }
}
