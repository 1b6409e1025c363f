//! TLS to all three servers, with certificates made here (a test CA, a server certificate for
//! `localhost`, a client certificate):
//! - NATS: a throwaway `nats-server` that requires TLS and a client certificate (`verify: true`);
//! - MongoDB: a throwaway SecantusDB with TLS and required client certificates;
//! - PostgreSQL: the local server is built without SSL, so a TLS-terminating proxy that answers
//!   PostgreSQL's `SSLRequest` stands in front of it (the worker's side, sqlx with
//!   `sslmode=verify-full&sslrootcert=…`, is what is proven; the last hop is plaintext on loopback).
//!
//! A whole turn runs through them, and connections without the CA (or without a client certificate)
//! are refused.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use crate::{env::*, servers::*};
use companion_dev::stub::{StubReply, always};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Files of a test PKI.
pub(crate) struct Pki {
    dir: PathBuf,
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    /// Client certificate and key in one file (MongoDB's `tlsCertificateKeyFile`).
    client_pem: PathBuf,
}

impl Drop for Pki {
    /// Removes the certificates and the servers' data, also after a failed assertion (the servers,
    /// created later, are dropped first).
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn make_pki() -> Pki {
    let dir = std::env::temp_dir().join(format!("companion-tls-{:016x}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "companion test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);

    let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose| {
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name.push(DnType::CommonName, "companion");
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(
        vec!["localhost".into(), "127.0.0.1".into()],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_cert, client_key) = leaf(
        vec!["companion-worker".into()],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    Pki {
        ca: write("ca.pem", &ca_cert.pem()),
        server_cert: write("server.pem", &server_cert),
        server_key: write("server-key.pem", &server_key),
        client_cert: write("client.pem", &client_cert),
        client_key: write("client-key.pem", &client_key),
        client_pem: write("client-both.pem", &format!("{client_cert}{client_key}")),
        dir,
    }
}

/// `nats-server` with JetStream and TLS that verifies client certificates. Returns (client, monitor) ports.
/// `tls_extra` goes into the server's `tls {}` block (e.g. `verify: true`).
pub(crate) async fn start_nats(pki: &Pki, tls_extra: &str) -> (Server, u16, u16) {
    let [port, monitor] = free_ports();
    let name = format!("nats-{port}");
    let conf = pki.dir.join(format!("{name}.conf"));
    std::fs::write(
        &conf,
        format!(
            "listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{monitor}\n\
             jetstream {{ store_dir: \"{store}\" }}\n\
             tls {{\n  cert_file: \"{cert}\"\n  key_file: \"{key}\"\n  ca_file: \"{ca}\"\n  timeout: 2\n  {tls_extra}\n}}\n",
            store = pki.dir.join(&name).display(),
            cert = pki.server_cert.display(),
            key = pki.server_key.display(),
            ca = pki.ca.display(),
        ),
    )
    .unwrap();
    let bin = nats_server_bin();
    let log_path = pki.dir.join(format!("{name}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let child = Command::new(&bin)
        .arg("--config")
        .arg(&conf)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("{} starts: {e}", bin.display()));
    let server = Server(child);
    assert!(
        nats_healthy(monitor).await,
        "nats-server with TLS is healthy (log: {})",
        log_path.display()
    );
    (server, port, monitor)
}

/// SecantusDB with TLS, requiring client certificates signed by the test CA.
async fn start_secantus(pki: &Pki) -> (Server, u16) {
    let port = free_port();
    let python = local_dir().join("venv/bin/python");
    let log = std::fs::File::create(pki.dir.join("secantus.log")).unwrap();
    let child = Command::new(&python)
        .args(["-m", "secantus", "--host", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .arg("--storage-path")
        .arg(pki.dir.join("mongo"))
        .arg("--tls-cert-file")
        .arg(&pki.server_cert)
        .arg("--tls-key-file")
        .arg(&pki.server_key)
        .arg("--tls-ca-file")
        .arg(&pki.ca)
        .arg("--tls-require-client-cert")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("{} starts: {e}", python.display()));
    let server = Server(child);
    let uri = mongo_uri(port, "admin", pki, true);
    assert!(
        eventually(Duration::from_secs(30), || async {
            let Ok(client) = mongodb::Client::with_uri_str(&uri).await else {
                return false;
            };
            client
                .database("admin")
                .run_command(bson::doc! {"ping": 1})
                .await
                .is_ok()
        })
        .await,
        "SecantusDB with TLS answers (log: {})",
        pki.dir.join("secantus.log").display()
    );
    (server, port)
}

fn mongo_uri(port: u16, db: &str, pki: &Pki, with_ca: bool) -> String {
    let ca = if with_ca {
        format!("&tlsCAFile={}", pki.ca.display())
    } else {
        String::new()
    };
    format!(
        "mongodb://localhost:{port}/{db}?directConnection=true&serverSelectionTimeoutMS=3000\
         &tls=true{ca}&tlsCertificateKeyFile={}",
        pki.client_pem.display()
    )
}

/// Accepts PostgreSQL clients that ask for TLS (`SSLRequest`), terminates TLS and forwards the plain
/// protocol to `upstream`. Clients that do not ask for TLS are disconnected. Counts TLS sessions.
async fn start_pg_tls_proxy(pki: &Pki, upstream: String) -> (SocketAddr, Arc<AtomicUsize>) {
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(&pki.server_cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&pki.server_key).unwrap();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sessions = Arc::new(AtomicUsize::new(0));
    let count = sessions.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let (acceptor, upstream, count) = (acceptor.clone(), upstream.clone(), count.clone());
            tokio::spawn(async move {
                // SSLRequest: length 8, code 80877103.
                let mut first = [0u8; 8];
                if client.read_exact(&mut first).await.is_err()
                    || first != [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]
                {
                    return;
                }
                if client.write_all(b"S").await.is_err() {
                    return;
                }
                let Ok(mut tls) = acceptor.accept(client).await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
                }
            });
        }
    });
    (addr, sessions)
}

/// `url` pointed at `authority` (host:port), with `query` added.
fn retarget(url: &str, authority: &str, query: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (format!("{u}@"), r),
        None => (String::new(), rest),
    };
    let path = rest.find('/').map(|i| &rest[i..]).unwrap_or("/");
    let sep = if path.contains('?') { '&' } else { '?' };
    format!("{scheme}://{userinfo}{authority}{path}{sep}{query}")
}

fn authority(url: &str) -> String {
    let rest = url.split_once("://").unwrap().1;
    let rest = rest.rsplit_once('@').map(|(_, r)| r).unwrap_or(rest);
    rest.split(['/', '?']).next().unwrap().to_owned()
}

#[tokio::test]
async fn a_whole_turn_runs_over_tls_to_nats_mongodb_and_postgresql() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = make_pki();
    let (nats, nats_port, nats_monitor) = start_nats(&pki, "verify: true").await;
    let (secantus, mongo_port) = start_secantus(&pki).await;
    let base = companion::Config::from_env().unwrap();
    let (pg_proxy, pg_sessions) = start_pg_tls_proxy(&pki, authority(&base.pg.url)).await;

    let nats_url = format!("nats://localhost:{nats_port}");
    let ca = pki.ca.display().to_string();
    let pg_tls = format!("sslmode=verify-full&sslrootcert={ca}");
    let (client_cert, client_key) = (pki.client_cert.clone(), pki.client_key.clone());
    let pki_ref = &pki;
    let env = TestEnv::with(always(StubReply::text("hello over TLS!")), |c| {
        c.nats.url = nats_url.clone();
        c.nats.tls_ca_file = Some(pki_ref.ca.clone());
        c.nats.tls_cert_file = Some(client_cert);
        c.nats.tls_key_file = Some(client_key);
        let db = c.mongo.database();
        c.mongo.uri = mongo_uri(mongo_port, &db, pki_ref, true);
        c.pg.url = retarget(
            &c.pg.url,
            &format!("localhost:{}", pg_proxy.port()),
            &pg_tls,
        );
    })
    .await;
    env.spawn_app().await;
    let event = env.dm(JESS, KAORI, JESS_KAORI, "are we encrypted?").await;
    let reply = env.turn(&event).await;
    assert_eq!(reply.content, "hello over TLS!");
    assert_eq!(env.replies_to(&event.message_id).await.len(), 1);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM bot_conversations")
        .fetch_one(&env.pg.pool)
        .await
        .unwrap();
    assert_eq!(rows, 2, "history written through the TLS proxy");
    assert!(
        pg_sessions.load(Ordering::SeqCst) >= 2,
        "test pool and worker pool used TLS"
    );

    // Every NATS connection (the test's and the worker's) is TLS.
    let connz: serde_json::Value = reqwest::get(format!("http://127.0.0.1:{nats_monitor}/connz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let conns = connz["connections"].as_array().unwrap();
    assert!(conns.len() >= 2, "{connz}");
    for c in conns {
        assert!(
            c["tls_version"]
                .as_str()
                .is_some_and(|v| v.starts_with("1.")),
            "{c}"
        );
    }

    // Without the CA, or without a client certificate, the servers are not reached.
    let refused = async_nats::ConnectOptions::new()
        .require_tls(true)
        .add_root_certificates(pki.ca.clone())
        .connect(&nats_url)
        .await;
    let refused = refused.expect_err("NATS requires a client certificate");
    eprintln!("NATS without a client certificate: {refused}");
    let untrusted = mongodb::Client::with_uri_str(mongo_uri(mongo_port, "admin", &pki, false))
        .await
        .unwrap()
        .database("admin")
        .run_command(bson::doc! {"ping": 1})
        .await;
    let untrusted = untrusted.expect_err("MongoDB: the test CA is not a system root");
    eprintln!("MongoDB without the CA: {untrusted}");
    let pg_untrusted = retarget(
        &env.config.pg.url.replace(&format!("&sslrootcert={ca}"), ""),
        &format!("localhost:{}", pg_proxy.port()),
        "connect_timeout=5",
    );
    let err = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(5))
        .connect(&pg_untrusted)
        .await
        .expect_err("PostgreSQL: verify-full refuses an unknown issuer");
    eprintln!("PostgreSQL without the CA: {err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate")
            || err.to_string().contains("UnknownIssuer"),
        "{err}"
    );

    env.finish().await;
    drop((nats, secantus));
}

#[tokio::test]
async fn nats_tls_first_reaches_a_server_with_handshake_first() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = make_pki();
    let (_nats, port, _) = start_nats(&pki, "handshake_first: true").await;
    let mut config = companion::Config::from_env().unwrap();
    config.nats.url = format!("nats://localhost:{port}");
    config.nats.tls_ca_file = Some(pki.ca.clone());
    config.nats.tls_first = true;
    config.nats.stream_prefix = format!("T{:016x}", fastrand::u64(..));
    config.nats.subject_prefix = format!("t{}.dm.bot", config.nats.stream_prefix);
    let bus = companion_store::bus::Bus::connect(&config.nats)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), bus.ensure_streams())
        .await
        .expect("JetStream answers over TLS-first")
        .unwrap();
    // Without TLS first the server, which waits for a TLS handshake, is not reached.
    let plain_first = async_nats::ConnectOptions::new()
        .require_tls(true)
        .add_root_certificates(pki.ca.clone())
        .connection_timeout(Duration::from_secs(3))
        .connect(&config.nats.url)
        .await;
    assert!(
        plain_first.is_err(),
        "a client that waits for INFO first is not served"
    );
}
