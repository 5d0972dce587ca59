//! keyturnd's HTTP server against stalled clients (issue 28, item 12), with
//! real sockets: connections that dribble header bytes are closed, a
//! connection past the cap is refused at once while `/healthz` still
//! answers once a slot frees, a request whose body stalls is answered 408,
//! and a client holding a half-sent request does not keep keyturnd from
//! exiting after SIGTERM. The real binary runs without a database (these
//! are the HTTP side alone).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support;
use crate::support::e2e::{eventually, Keyturnd};

/// Bounds each wait for a state, so a regression fails instead of hanging.
const WITHIN: Duration = Duration::from_secs(60);

/// keyturnd without a database (alive, never ready) with `env`.
async fn alive(env: Vec<(&'static str, String)>) -> Keyturnd {
    let k = Keyturnd::spawn(support::closed_port(), env);
    eventually(WITHIN, "/healthz", || async {
        (k.get_status("/healthz").await == Some(200)).then_some(())
    })
    .await;
    k
}

fn addr(k: &Keyturnd) -> String {
    k.base.trim_start_matches("http://").to_owned()
}

/// A connection that has had one `/healthz` answered and stays open
/// (keep-alive): one the server has certainly accepted.
async fn served(addr: &str) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: k\r\n\r\n")
        .await
        .ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"ok\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    Some(s)
}

/// Waits until the server ends the connection (or answers on it): a read
/// that returns anything.
async fn ended(s: &mut TcpStream) {
    let mut buf = [0u8; 256];
    let _ = s.read(&mut buf).await;
}

#[tokio::test]
async fn test_connections_dribbling_header_bytes_are_closed() {
    let k = alive(vec![("KEYTURN_SERVER_HEADER_SECONDS", "2".into())]).await;
    let addr = addr(&k);
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let mut s = TcpStream::connect(&addr).await.expect("connect");
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: k\r\nX-Slow: ")
            .await
            .expect("write");
        tasks.push(tokio::spawn(async move {
            let mut buf = [0u8; 256];
            loop {
                tokio::select! {
                    _ = s.read(&mut buf) => return,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {
                        if s.write_all(b"a").await.is_err() {
                            return;
                        }
                    }
                }
            }
        }));
    }
    let all = futures_util::future::join_all(tasks);
    tokio::time::timeout(WITHIN, all)
        .await
        .expect("every connection that never finishes its headers is closed");
    assert_eq!(k.get_status("/healthz").await, Some(200));
}

/// keyturnd (without a database) with a cap of four connections and a
/// header timeout no test waits for.
fn four_connections() -> Keyturnd {
    Keyturnd::spawn(
        support::closed_port(),
        vec![
            ("KEYTURN_SERVER_CONNECTIONS", "4".into()),
            ("KEYTURN_SERVER_HEADER_SECONDS", "300".into()),
        ],
    )
}

/// `serve` of a router with `GET /ok` and `POST /echo` (which reads its
/// body) on a port of its own, with a cap of four connections and timeouts
/// no test waits for.
async fn four_slots() -> std::net::SocketAddr {
    use axum::body::Bytes;
    use keyturnd::server::{serve, Limits};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let router = axum::Router::new()
        .route("/ok", axum::routing::get(|| async { "ok\n" }))
        .route(
            "/hang",
            axum::routing::get(std::future::pending::<&'static str>),
        )
        .route(
            "/echo",
            axum::routing::post(|body: Bytes| async move { body }),
        );
    let limits = Limits {
        header_read: Duration::from_secs(300),
        request: Duration::from_secs(300),
        connections: 4,
    };
    tokio::spawn(serve(listener, router, limits, std::future::pending()));
    addr
}

/// A connection with a request under way: sent whole, its answer not yet
/// given (`GET /hang` never answers).
async fn busy(addr: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /hang HTTP/1.1\r\nHost: k\r\n\r\n")
        .await
        .expect("write");
    s
}

/// A connection whose request head went and whose body stalls.
async fn stalled_body(addr: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: k\r\nContent-Length: 100\r\n\r\nhalf")
        .await
        .expect("write");
    s
}

/// A connection that had `GET /ok` answered and stays open, idle.
async fn answered(addr: std::net::SocketAddr) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    s.write_all(b"GET /ok HTTP/1.1\r\nHost: k\r\n\r\n")
        .await
        .ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"ok\n") {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
    Some(s)
}

#[tokio::test]
async fn test_a_connection_past_a_cap_of_busy_ones_is_refused_and_served_once_one_frees() {
    let addr = four_slots().await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(busy(addr).await);
    }
    // Accepted, and their heads read, before the fifth.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut fifth = TcpStream::connect(addr).await.expect("the kernel accepts");
    let _ = fifth
        .write_all(b"GET /ok HTTP/1.1\r\nHost: k\r\n\r\n")
        .await;
    let mut buf = [0u8; 256];
    let answer = tokio::time::timeout(WITHIN, fifth.read(&mut buf))
        .await
        .expect("refused at once, not left waiting");
    assert!(
        !matches!(answer, Ok(n) if n > 0),
        "a fifth connection was served: {:?}",
        String::from_utf8_lossy(&buf)
    );
    drop(held.pop());
    eventually(WITHIN, "/ok once a slot is free", || async {
        answered(addr).await.map(|_| ())
    })
    .await;
}

/// With `held` taking every slot of [`four_slots`], three clients in turn
/// are answered, and at least one of `held` was closed for them.
async fn they_give_way(addr: std::net::SocketAddr, mut held: Vec<TcpStream>, what: &str) {
    for i in 0..3 {
        assert!(
            answered(addr).await.is_some(),
            "client {i} was kept out by {what}"
        );
    }
    let mut closed = 0;
    for s in &mut held {
        let mut buf = [0u8; 16];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await
        {
            closed += 1;
        }
    }
    assert!(closed >= 1, "none of the {what} was closed");
}

/// Requests whose bodies stalled held the cap until the request timeout,
/// and again as soon as the client opened them anew (twenty-seventh
/// red-team pass; docs/security.md, row 137). A connection waits until its
/// request's body has arrived whole, and gives way at the cap meanwhile.
#[tokio::test]
async fn test_connections_whose_bodies_stall_give_way_at_the_cap() {
    let addr = four_slots().await;
    let mut stalled = Vec::new();
    for _ in 0..4 {
        stalled.push(stalled_body(addr).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    they_give_way(addr, stalled, "requests whose bodies stalled").await;
}

/// At the cap, a body still arriving was closed as soon as it was the
/// longest in line: one client opening bare connections in a loop cut every
/// slow upload (twenty-eighth red-team pass; docs/security.md, row 137).
/// Connections with no request under way go first, and a body that keeps
/// coming goes to the back of its line with each of its bytes.
#[tokio::test]
async fn test_an_upload_under_way_outlasts_connections_that_send_nothing() {
    let addr = four_slots().await;
    let mut upload = TcpStream::connect(addr).await.expect("connect");
    upload
        .write_all(b"POST /echo HTTP/1.1\r\nHost: k\r\nContent-Length: 40\r\n\r\n")
        .await
        .expect("head");
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"G").await.expect("write");
        held.push(s);
    }
    for _ in 0..8 {
        upload
            .write_all(b"12345")
            .await
            .expect("the upload goes on");
        // A bare connection at the cap each time: one of those that sent
        // nothing gives way, not the upload.
        held.push(TcpStream::connect(addr).await.expect("connect"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(WITHIN, async {
        while !got.ends_with(b"1234512345123451234512345123451234512345") {
            match upload.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("answered");
    let answer = String::from_utf8_lossy(&got);
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the upload was cut: {answer:?}"
    );
}

/// Idle keep-alive connections held the cap as well: one client sent one
/// request on each, read the answer and kept it open (twenty-sixth red-team
/// pass; docs/security.md, row 137). Such a connection waits for a head
/// again, and gives way at the cap as one that sent none does.
#[tokio::test]
async fn test_idle_keep_alive_connections_give_way_at_the_cap() {
    let addr = four_slots().await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(answered(addr).await.expect("a connection within the cap"));
    }
    they_give_way(addr, idle, "idle keep-alive connections").await;
}

/// One client holding the cap in connections that each sent a byte of a
/// request head, and opening them again as they are closed, kept every
/// other client out: a new connection at the cap was closed at accept
/// (twenty-fourth red-team pass; docs/security.md, row 137). A new one now
/// takes the place of the oldest that has sent no request head.
#[tokio::test]
async fn test_connections_that_sent_no_request_give_way_at_the_cap() {
    let k = four_connections();
    let addr = addr(&k);
    eventually(WITHIN, "keyturnd listening", || served(&addr)).await;
    let mut stalled = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(&addr).await.expect("connect");
        s.write_all(b"G").await.expect("write");
        stalled.push(s);
    }
    // Accepted before the clients below, in the order they connected.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..3 {
        let answered = tokio::time::timeout(Duration::from_secs(10), served(&addr))
            .await
            .ok()
            .flatten();
        assert!(
            answered.is_some(),
            "client {i} was kept out by connections that sent one byte"
        );
    }
    let mut closed = 0;
    for s in &mut stalled {
        let mut buf = [0u8; 16];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await
        {
            closed += 1;
        }
    }
    assert!(
        closed >= 1,
        "no connection that sent no request head was closed"
    );
}

#[tokio::test]
async fn test_sigterm_exits_despite_clients_holding_half_sent_requests() {
    let mut k = alive(vec![
        ("KEYTURN_SHUTDOWN_SECONDS", "2".into()),
        ("KEYTURN_SERVER_HEADER_SECONDS", "300".into()),
        ("KEYTURN_SERVER_REQUEST_SECONDS", "300".into()),
    ])
    .await;
    let addr = addr(&k);
    let mut half_headers = TcpStream::connect(&addr).await.expect("connect");
    half_headers
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: k\r\n")
        .await
        .expect("write");
    let mut half_body = TcpStream::connect(&addr).await.expect("connect");
    half_body
        .write_all(b"POST /rpc/preview HTTP/1.1\r\nHost: k\r\nContent-Length: 100\r\n\r\n{\"a\":")
        .await
        .expect("write");
    let idle = served(&addr).await.expect("served");
    k.signal("-TERM");
    let status = k.wait_exit(WITHIN).await;
    assert_eq!(status.code(), Some(0), "log:\n{}", k.log());
    ended(&mut half_headers).await;
    ended(&mut half_body).await;
    drop(idle);
}

#[tokio::test]
async fn test_a_request_whose_body_stalls_is_answered_408() {
    use axum::body::Bytes;
    use keyturnd::server::{serve, Limits};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let router = axum::Router::new().route(
        "/echo",
        axum::routing::post(|body: Bytes| async move { body }),
    );
    let limits = Limits {
        header_read: Duration::from_secs(300),
        request: Duration::from_secs(1),
        connections: 8,
    };
    tokio::spawn(serve(listener, router, limits, std::future::pending()));
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: k\r\nContent-Length: 100\r\n\r\nhalf")
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(WITHIN, async {
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("answered, not left waiting for the body");
    let head = String::from_utf8_lossy(&got);
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
}

#[tokio::test]
async fn test_a_client_that_stops_reading_its_answers_loses_its_connection() {
    // Seventh red-team pass (docs/security.md, row 89): no timer ran while
    // keyturnd wrote an answer, so a client that pipelined requests for a
    // public page and never read the answers held its connection for good;
    // the cap's worth of them took every connection, /healthz and /rpc
    // included. A write that makes no progress for the request timeout
    // ends the connection now.
    let k = alive(vec![
        ("KEYTURN_SERVER_CONNECTIONS", "4".into()),
        ("KEYTURN_SERVER_REQUEST_SECONDS", "2".into()),
        ("KEYTURN_SERVER_HEADER_SECONDS", "300".into()),
    ])
    .await;
    let addr = addr(&k);
    let mut stalled = Vec::new();
    for _ in 0..4 {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .set_recv_buffer_size(1024)
            .expect("a small receive buffer");
        let mut s = socket
            .connect(addr.parse().unwrap())
            .await
            .expect("connect");
        // Writes until keyturnd stops reading, then waits, never reading.
        stalled.push(tokio::spawn(async move {
            let request = b"GET /card/keyturn-card.js HTTP/1.1\r\nHost: k\r\n\r\n".repeat(300);
            let _ = s.write_all(&request).await;
            tokio::time::sleep(WITHIN * 2).await;
            drop(s);
        }));
    }
    // With the four slots held, /healthz is refused at accept until the
    // stalled connections are closed: then it answers.
    eventually(
        WITHIN / 2,
        "a slot freed from a client that does not read",
        || async { served(&addr).await.map(|_| ()) },
    )
    .await;
    for task in stalled {
        task.abort();
    }
}
