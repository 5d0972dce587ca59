//! TEST-ONLY fake SMTP server. It speaks just enough SMTP (RFC 5321) for the
//! adapter tests — greeting, EHLO, MAIL, RCPT, DATA, QUIT — with scripted
//! replies, and records what it received. It is not a mail server and is
//! never built into keyturnd.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// The replies to send. `end_of_data: None` never answers the final `.`.
#[derive(Clone, Copy, Debug)]
pub struct Script {
    pub greeting: &'static str,
    pub mail: &'static str,
    pub rcpt: &'static str,
    pub end_of_data: Option<&'static str>,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            greeting: "220 fake.test ESMTP ready",
            mail: "250 2.1.0 OK",
            rcpt: "250 2.1.5 OK",
            end_of_data: Some("250 2.0.0 OK queued"),
        }
    }
}

/// One transaction that reached end of data.
#[derive(Clone, Debug, Default)]
pub struct Delivered {
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    pub data: String,
}

/// What the server saw.
#[derive(Clone, Default)]
pub struct Log {
    pub delivered: Arc<Mutex<Vec<Delivered>>>,
    pub connections: Arc<Mutex<usize>>,
    /// When the reply to each delivered message's end of data was written,
    /// by its index in `delivered`.
    pub answered: Arc<Mutex<Vec<(usize, std::time::Instant)>>>,
}

impl Log {
    pub fn delivered(&self) -> Vec<Delivered> {
        self.delivered.lock().expect("log").clone()
    }
    pub fn connections(&self) -> usize {
        *self.connections.lock().expect("log")
    }
    pub fn answered(&self) -> Vec<(usize, std::time::Instant)> {
        self.answered.lock().expect("log").clone()
    }
}

/// Starts a server on 127.0.0.1:0 that follows `script` on every connection.
pub async fn start(script: Script) -> (SocketAddr, Log) {
    start_with_delay(script, Duration::ZERO).await
}

/// [`start`], answering the end of each message after a random pause of at
/// most `max_delay` (a provider that takes a while to accept a message).
pub async fn start_with_delay(script: Script, max_delay: Duration) -> (SocketAddr, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let log = Log::default();
    let server_log = log.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            *server_log.connections.lock().expect("log") += 1;
            let log = server_log.clone();
            tokio::spawn(async move {
                let _ = session(stream, script, log, max_delay).await;
            });
        }
    });
    (addr, log)
}

async fn session(
    stream: tokio::net::TcpStream,
    script: Script,
    log: Log,
    max_delay: Duration,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    write
        .write_all(format!("{}\r\n", script.greeting).as_bytes())
        .await?;
    if !script.greeting.starts_with('2') {
        return Ok(());
    }
    let mut current = Delivered::default();
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let upper = line.trim_end().to_ascii_uppercase();
        let answer: String = if upper.starts_with("EHLO") || upper.starts_with("HELO") {
            "250-fake.test\r\n250-8BITMIME\r\n250 SMTPUTF8".into()
        } else if upper.starts_with("MAIL FROM:") {
            current = Delivered {
                mail_from: line.trim_end()[10..].trim().to_owned(),
                ..Delivered::default()
            };
            script.mail.into()
        } else if upper.starts_with("RCPT TO:") {
            current.rcpt_to.push(line.trim_end()[8..].trim().to_owned());
            script.rcpt.into()
        } else if upper == "DATA" {
            write.write_all(b"354 end with <CRLF>.<CRLF>\r\n").await?;
            let mut data = String::new();
            loop {
                line.clear();
                if lines.read_line(&mut line).await? == 0 {
                    return Ok(());
                }
                if line == ".\r\n" {
                    break;
                }
                data.push_str(&line);
            }
            current.data = data;
            let index = {
                let mut delivered = log.delivered.lock().expect("log");
                delivered.push(std::mem::take(&mut current));
                delivered.len() - 1
            };
            if !max_delay.is_zero() {
                tokio::time::sleep(super::random_duration(max_delay)).await;
            }
            match script.end_of_data {
                Some(text) => {
                    write.write_all(format!("{text}\r\n").as_bytes()).await?;
                    log.answered
                        .lock()
                        .expect("log")
                        .push((index, std::time::Instant::now()));
                    continue;
                }
                None => {
                    // Never answer: the client must give up on its own.
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    return Ok(());
                }
            }
        } else if upper == "QUIT" {
            write.write_all(b"221 bye\r\n").await?;
            return Ok(());
        } else if upper == "RSET" || upper == "NOOP" {
            "250 OK".into()
        } else {
            "502 command not implemented".into()
        };
        write.write_all(format!("{answer}\r\n").as_bytes()).await?;
    }
}
