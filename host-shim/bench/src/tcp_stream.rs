//! The `tcp-stream` path: what one TCP stream carries on the path the TCP transports
//! take, the bar for `shim-ucx-tcp` and `shim-ofi-tcp` (issue 26, item 4). A source
//! writes a buffer of zeros in a loop; this program reads it in `--block-bytes` pieces
//! for the cell's duration, on one connection, and counts the bytes. No dpuio, no file:
//! a plain socket copy, the most a single stream gives on that path.
//!
//! The source listens on the agent's host address (`--agent`), in a thread of this
//! process, so the stream takes the route the transports take to reach the agent:
//! loopback when the agent is local. When the agent is in another network namespace or
//! machine, that address is not this one's: run `dpuio-bench stream-source --listen
//! HOST:0` beside the agent and pass the address it prints as `--stream-source`.
//!
//! Host CPU is the reading thread's own (`CLOCK_THREAD_CPUTIME_ID`), not the source's,
//! which plays the agent's part. What it deliberately does not do: tune the socket
//! (buffer sizes, `TCP_NODELAY`): the kernel's defaults are what the transports get.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use dpuio_bench_core::Figures;

/// The path's name in the figures and in `--paths`.
pub const TCP_STREAM: &str = "tcp-stream";
/// What the source writes per call.
const SOURCE_CHUNK_BYTES: usize = 1 << 20;

/// Where the stream comes from for the whole run.
#[derive(Clone, Copy)]
pub struct StreamSource {
    pub address: SocketAddr,
}

impl StreamSource {
    /// `--stream-source ADDR` if given, else a source thread listening on the agent's
    /// host address (`agent`: `HOST:PORT`, `http://HOST:PORT` or `https://...`).
    pub fn start(agent: &str, remote: Option<&str>) -> Result<StreamSource, String> {
        if let Some(remote) = remote {
            let address = resolve(remote).map_err(|e| format!("--stream-source {remote}: {e}"))?;
            return Ok(StreamSource { address });
        }
        let host = agent_host(agent).ok_or_else(|| {
            format!("{TCP_STREAM}: cannot tell the host of the agent address {agent:?} (HOST:PORT or http://HOST:PORT)")
        })?;
        let listener = TcpListener::bind((host.as_str(), 0)).map_err(|e| {
            format!(
                "{TCP_STREAM}: cannot listen on {host} (the agent's address) here: {e}; when the agent is in another \
                 namespace or machine, run `dpuio-bench stream-source --listen {host}:0` there and pass the address it \
                 prints as --stream-source"
            )
        })?;
        let address = listener.local_addr().map_err(|e| format!("{TCP_STREAM}: {e}"))?;
        std::thread::Builder::new()
            .name("tcp-stream-source".into())
            .spawn(move || serve(listener))
            .map_err(|e| format!("{TCP_STREAM}: cannot start the source thread: {e}"))?;
        Ok(StreamSource { address })
    }

    /// One cell: read the stream in `block`-byte pieces for `duration`.
    pub fn cell(&self, block: u64, duration: Duration) -> Result<Figures, String> {
        let mut stream = TcpStream::connect(self.address)
            .map_err(|e| format!("{TCP_STREAM}: cannot connect to the source at {}: {e}", self.address))?;
        let mut buf = vec![0u8; block as usize];
        let cpu0 = thread_cpu();
        let t0 = Instant::now();
        let mut bytes = 0u64;
        while t0.elapsed() < duration {
            match stream.read(&mut buf) {
                Ok(0) => return Err(format!("{TCP_STREAM}: the source at {} closed the stream", self.address)),
                Ok(n) => bytes += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("{TCP_STREAM}: reading from {}: {e}", self.address)),
            }
        }
        let wall = t0.elapsed();
        Ok(Figures {
            workload: String::new(),
            path: TCP_STREAM.into(),
            block_bytes: block,
            queue_depth: 1,
            threads: 1,
            bytes,
            ops: bytes / block.max(1),
            wall,
            host_cpu: thread_cpu().saturating_sub(cpu0),
            ..Default::default()
        })
    }
}

/// `dpuio-bench stream-source --listen ADDR`: serve the stream until killed, after
/// printing the address it listens on (the port the kernel chose for `:0`).
pub fn serve_forever(listen: &str) -> Result<(), String> {
    let address = resolve(listen).map_err(|e| format!("--listen {listen}: {e}"))?;
    let listener = TcpListener::bind(address).map_err(|e| format!("cannot listen on {address}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    println!("{bound}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    serve(listener);
    Ok(())
}

/// Every connection gets zeros on a thread of its own until its reader goes.
fn serve(listener: TcpListener) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let _ = std::thread::Builder::new().name("tcp-stream-writer".into()).spawn(move || {
            let zeros = vec![0u8; SOURCE_CHUNK_BYTES];
            while conn.write_all(&zeros).is_ok() {}
        });
    }
}

fn resolve(address: &str) -> Result<SocketAddr, String> {
    address
        .to_socket_addrs()
        .map_err(|e| format!("not an address ({e}); give HOST:PORT"))?
        .next()
        .ok_or_else(|| "resolves to no address".to_owned())
}

/// The host part of an agent address: `HOST:PORT`, `[V6]:PORT`, with or without a
/// `http://` or `https://` scheme.
pub fn agent_host(agent: &str) -> Option<String> {
    let rest = agent.strip_prefix("http://").or_else(|| agent.strip_prefix("https://")).unwrap_or(agent);
    let authority = rest.split('/').next()?;
    let (host, port) = authority.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    (!host.is_empty()).then(|| host.to_owned())
}

/// This thread's CPU time so far.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_host_takes_every_form_of_agent_address() {
        assert_eq!(agent_host("127.0.0.1:7300").as_deref(), Some("127.0.0.1"));
        assert_eq!(agent_host("http://10.0.0.1:7300").as_deref(), Some("10.0.0.1"));
        assert_eq!(agent_host("https://dpu.example:7300/").as_deref(), Some("dpu.example"));
        assert_eq!(agent_host("[::1]:7300").as_deref(), Some("::1"));
        assert_eq!(agent_host("no-port"), None);
        assert_eq!(agent_host(":7300"), None);
        assert_eq!(agent_host("host:notaport"), None);
    }

    #[test]
    fn a_cell_reads_the_source_for_its_duration() {
        let source = StreamSource::start("127.0.0.1:1", None).expect("loopback source");
        let fig = source.cell(1 << 20, Duration::from_millis(50)).expect("cell");
        assert!(fig.wall >= Duration::from_millis(50));
        assert!(fig.bytes >= 1 << 20, "{} bytes in 50 ms over loopback", fig.bytes);
        assert_eq!(fig.path, TCP_STREAM);
        assert_eq!(fig.ops, fig.bytes >> 20);
    }
}
