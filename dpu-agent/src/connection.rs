//! Connections that say when they close: how the agent notices a host process that died.
//!
//! A host process holds its own HTTP/2 connection per session (the shim opens one per
//! `Client::connect`). When the process dies, by SIGKILL too, its kernel closes the
//! socket, the server drops the connection, and [`Tracked`]'s drop reports the peer
//! address; the agent then ends the sessions attached over it after a short grace
//! ([`crate::state::Agent::connection_closed`]) instead of when their lease lapses.
//!
//! It deliberately looks at nothing but the connection: a host's pid means nothing on
//! the DPU, and the data-plane endpoint of a shared-memory transport reports no error
//! when its peer dies.

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedSender;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Where closed connections are reported: their peer address.
pub type ClosedConnections = UnboundedSender<SocketAddr>;

/// An accepted TCP connection that reports its peer address to `closed` when dropped.
pub struct Tracked {
    stream: TcpStream,
    peer: Option<SocketAddr>,
    closed: Option<ClosedConnections>,
}

impl Tracked {
    pub fn new(stream: TcpStream, closed: Option<ClosedConnections>) -> Tracked {
        Tracked { peer: stream.peer_addr().ok(), stream, closed }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let (Some(peer), Some(closed)) = (self.peer, &self.closed) {
            let _ = closed.send(peer); // the agent is stopping when no one listens
        }
    }
}

impl Connected for Tracked {
    // The plain TCP connection's: `Request::remote_addr` and, under TLS,
    // `Request::peer_certs` look for exactly these types.
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Tracked {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dropping_reports_the_peer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let tracked = Tracked::new(accepted, Some(tx));
        assert_eq!(tracked.connect_info().remote_addr, Some(client.local_addr().unwrap()));
        drop(tracked);
        assert_eq!(rx.recv().await, Some(client.local_addr().unwrap()));
    }
}
