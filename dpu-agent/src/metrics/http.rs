//! The `[metrics] listen` endpoint: `GET /metrics` over HTTP/1.1, nothing else.
//!
//! A scraper sends one small request per connection every few seconds, so this is a
//! deliberately tiny server rather than a web stack: it reads one request head (at most
//! [`MAX_HEAD_BYTES`], within [`READ_TIMEOUT`]), answers it, and closes the connection.
//! The answer is decided by [`answer`], without I/O. At most [`MAX_CONNECTIONS`] are
//! served at once; further ones wait in the kernel's accept queue.
//!
//! It speaks plaintext and has no authentication: listen on loopback or a management
//! network. The figures name tenants, never paths or file data.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{Format, Metrics};

/// The longest request head read; a longer one is answered 431.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// How long a client may take to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;

/// An HTTP response: status line, content type, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Answer {
    fn text(status: u16, body: &str) -> Answer {
        Answer { status, content_type: "text/plain; charset=utf-8", body: format!("{body}\n") }
    }

    /// The bytes on the wire (the connection closes after them).
    pub fn to_bytes(&self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            431 => "Request Header Fields Too Large",
            _ => "Internal Server Error",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n",
            self.status,
            self.content_type,
            self.body.len()
        );
        if self.status == 405 {
            out.push_str("allow: GET, HEAD\r\n");
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(self.body.as_bytes());
        bytes
    }
}

/// The answer to a request head (`head` up to and including its blank line): the
/// metrics for `GET /metrics` (OpenMetrics when the `Accept` header asks for it, else
/// the text format 0.0.4), 404 for another path, 405 for another method, 400 for what
/// is not an HTTP/1.x request. `HEAD` gets the headers of `GET` (the body is dropped by
/// the caller).
pub fn answer(head: &[u8], metrics: &Metrics) -> Answer {
    let Ok(head) = std::str::from_utf8(head) else { return Answer::text(400, "the request is not UTF-8") };
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut words = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (words.next(), words.next(), words.next(), words.next())
    else {
        return Answer::text(400, "expected a request line such as GET /metrics HTTP/1.1");
    };
    if !version.starts_with("HTTP/1.") {
        return Answer::text(400, "only HTTP/1.x is spoken here");
    }
    if method != "GET" && method != "HEAD" {
        return Answer::text(405, "only GET /metrics is served");
    }
    let path = target.split('?').next().unwrap_or_default();
    if path != "/metrics" {
        return Answer::text(404, "not found: the metrics are at /metrics");
    }
    let openmetrics = lines.any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("accept") && value.contains("application/openmetrics-text")
        })
    });
    let format = if openmetrics { Format::OpenMetrics } else { Format::Text004 };
    match metrics.encode(format) {
        Ok(body) => Answer { status: 200, content_type: format.content_type(), body },
        Err(_) => Answer::text(500, "the metrics could not be encoded"),
    }
}

/// Serve `GET /metrics` on `listener` until `stop` resolves.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, stop: impl std::future::Future<Output = ()>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(stop);
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => return,
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(stream, &metrics).await {
                tracing::debug!(error = %e, "metrics connection ended early");
            }
            drop(slot);
        });
    }
}

/// One request on one connection.
async fn connection(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let complete = tokio::time::timeout(READ_TIMEOUT, async {
        let mut buf = [0u8; 1024];
        loop {
            if head.windows(4).any(|w| w == b"\r\n\r\n") {
                return Ok(true);
            }
            if head.len() > MAX_HEAD_BYTES {
                return Ok(false);
            }
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed before its request"));
            }
            head.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no request head in time"))??;
    let answer = if complete { answer(&head, metrics) } else { Answer::text(431, "request head too large") };
    let mut bytes = answer.to_bytes();
    if head.starts_with(b"HEAD ") {
        bytes.truncate(bytes.len() - answer.body.len());
    }
    stream.write_all(&bytes).await?;
    stream.shutdown().await
}
