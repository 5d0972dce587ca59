//! A TCP proxy between keyturnd and PostgreSQL that can hold back the
//! answer to one lease step's `COMMIT`: the fault of issue 34 (a `COMMIT`
//! answer that arrives late, or a keyturnd paused just as it arrives).
//!
//! It reads the protocol only as far as it must: on each connection it
//! notes when `keyturn.begin_dispatch_many` was sent, and when `COMMIT`
//! follows while the proxy is armed, the next bytes the server sends on
//! that connection (the `COMMIT` answer: nothing else is outstanding, as
//! keyturnd waits for each statement) are held until [`PgProxy::release`].
//! It holds only a step whose lease answered a job of the tenant it was
//! armed for (the tenant's name among the bytes the server sent since the
//! last `COMMIT`), so that jobs other tests left queued, which any keyturnd
//! leases, never take the hold. Everything else passes through unchanged.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

struct Shared {
    armed: AtomicBool,
    /// Hold only a step that leased a job of this tenant.
    tenant: Mutex<Option<Vec<u8>>>,
    /// Set once an answer is being held.
    held: watch::Sender<bool>,
    release: Notify,
    released: AtomicBool,
}

/// The proxy; it runs until the test ends.
pub struct PgProxy {
    pub port: u16,
    shared: Arc<Shared>,
}

impl PgProxy {
    /// Listens on a free loopback port, forwarding to PostgreSQL on `pg_port`.
    pub async fn start(pg_port: u16) -> PgProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let shared = Arc::new(Shared {
            armed: AtomicBool::new(false),
            tenant: Mutex::new(None),
            held: watch::channel(false).0,
            release: Notify::new(),
            released: AtomicBool::new(false),
        });
        let s = shared.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", pg_port)).await {
                        relay(client, server, s).await;
                    }
                });
            }
        });
        PgProxy { port, shared }
    }

    /// Holds the answer to the next `COMMIT` that follows a
    /// `begin_dispatch_many` on its connection, in a step that leased a job
    /// of `tenant`.
    pub fn arm_for(&self, tenant: &str) {
        *self.shared.tenant.lock().unwrap() = Some(tenant.as_bytes().to_vec());
        self.shared.armed.store(true, Ordering::SeqCst);
    }

    /// Waits until an answer is held.
    pub async fn held(&self) {
        let mut rx = self.shared.held.subscribe();
        rx.wait_for(|held| *held).await.expect("proxy alive");
    }

    /// Lets the held answer through.
    pub fn release(&self) {
        self.shared.released.store(true, Ordering::SeqCst);
        self.shared.release.notify_waiters();
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// One direction of a connection, read in pieces: keeps the tail of the
/// previous read, so a name split across two reads is still seen.
#[derive(Default)]
struct Stream {
    tail: Vec<u8>,
}

impl Stream {
    /// Whether `needle` ends in `chunk` (it may begin in the read before).
    fn saw(&mut self, chunk: &[u8], needle: &[u8]) -> bool {
        let mut seen = std::mem::take(&mut self.tail);
        seen.extend_from_slice(chunk);
        let found = contains(&seen, needle);
        self.tail = seen[seen.len().saturating_sub(needle.len())..].to_vec();
        found
    }
}

async fn relay(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let hold_next = Arc::new(AtomicBool::new(false));
    let hold = hold_next.clone();
    // Set when the server named the armed tenant since the last COMMIT.
    let named = Arc::new(AtomicBool::new(false));
    let tenant_seen = named.clone();
    let s = shared.clone();
    let up = async move {
        let mut begun = false;
        let mut stream = Stream::default();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if stream.saw(&buf[..n], b"begin_dispatch_many") {
                begun = true;
            }
            if contains(&buf[..n], b"COMMIT") {
                let ours = tenant_seen.swap(false, Ordering::SeqCst);
                // Before the COMMIT reaches the server, so its answer cannot
                // slip through first.
                if begun && ours && s.armed.swap(false, Ordering::SeqCst) {
                    hold.store(true, Ordering::SeqCst);
                }
                begun = false;
            }
            if sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = sw.shutdown().await;
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut stream = Stream::default();
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some(tenant) = shared.tenant.lock().unwrap().as_deref() {
                if stream.saw(&buf[..n], tenant) {
                    named.store(true, Ordering::SeqCst);
                }
            }
            if hold_next.swap(false, Ordering::SeqCst) {
                let released = shared.release.notified();
                tokio::pin!(released);
                released.as_mut().enable();
                shared.held.send_replace(true);
                if !shared.released.load(Ordering::SeqCst) {
                    released.await;
                }
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, down);
}
