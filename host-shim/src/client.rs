//! The client: one attached, mounted session and the namespace calls on it.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use dpuio_proto::v1 as pb;
use pb::namespace_client::NamespaceClient;
use pb::session_client::SessionClient;
use std::path::PathBuf;
use tokio_stream::StreamExt;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::dataplane::{
    self, AnswerTo, Batch, DataPlane, DataPlaneOptions, DataPlaneStats, Done, RegisteredRegion, Request,
};
use crate::error::{Error, Result};
use crate::resume::{self, FileRecord, Liveness, Probe, Registry, ResumeOptions};
use dpuio_proto::attr::{Attr, DirEntry};
use dpuio_proto::host_ring::meta::{self as ring_meta, MetaCall};
use dpuio_proto::wire::{self, MetaOpcode, Opcode};
use host_bytes::HostBytes;

/// Where the CLI and library look for the agent when nothing says otherwise. An
/// address without a scheme (or `https://`) is reached with mutual TLS; `http://`
/// means plaintext, which agents allow on loopback with `[tls] mode = "off"` only.
pub const DEFAULT_AGENT: &str = "127.0.0.1:7300";

/// How the shim proves who it is to the agent (mutual TLS).
///
/// Each file not given is taken from the bundle directory: `bundle_dir`, else
/// `$DPUIO_CONFIG_DIR`, else `$HOME/.config/dpuio`, which holds `ca.pem`, `client.pem`
/// and `client.key`. A `dpu-agent` started on this machine with no TLS files configured
/// writes a development bundle for its default tenant there, so a local agent needs no
/// setup; `dpuctl cert issue --tenant NAME --out DIR` makes one for any tenant.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// The client certificate (PEM); `$DPUIO_CERT` by default.
    pub cert: Option<PathBuf>,
    /// Its private key (PEM); `$DPUIO_KEY` by default.
    pub key: Option<PathBuf>,
    /// The CA that issued the agent's certificate (PEM); `$DPUIO_CA` by default.
    pub ca: Option<PathBuf>,
    /// Where the files not named above are.
    pub bundle_dir: Option<PathBuf>,
    /// The name the agent's certificate must carry (default: the address's host).
    pub server_name: Option<String>,
}

impl TlsOptions {
    /// Files named by `$DPUIO_CERT`, `$DPUIO_KEY`, `$DPUIO_CA`, `$DPUIO_CONFIG_DIR`.
    pub fn from_env() -> TlsOptions {
        let path = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        TlsOptions {
            cert: path("DPUIO_CERT"),
            key: path("DPUIO_KEY"),
            ca: path("DPUIO_CA"),
            bundle_dir: path("DPUIO_CONFIG_DIR"),
            server_name: None,
        }
    }

    /// Only a bundle directory.
    pub fn bundle(dir: impl Into<PathBuf>) -> TlsOptions {
        TlsOptions { bundle_dir: Some(dir.into()), ..TlsOptions::default() }
    }

    fn bundle_dir(&self) -> Option<PathBuf> {
        self.bundle_dir.clone().or_else(|| {
            std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".config/dpuio"))
        })
    }

    /// The tonic TLS settings for an agent at `host`.
    fn client_config(&self, host: &str) -> Result<ClientTlsConfig> {
        let dir = self.bundle_dir();
        let pick = |given: &Option<PathBuf>, file: &str| given.clone().or_else(|| dir.as_ref().map(|d| d.join(file)));
        let files = [
            (pick(&self.cert, "client.pem"), "client certificate"),
            (pick(&self.key, "client.key"), "client key"),
            (pick(&self.ca, "ca.pem"), "CA certificate"),
        ];
        let mut pems = Vec::new();
        for (path, what) in files {
            let Some(path) = path else {
                return Err(Error::Tls { reason: format!("no {what}: $HOME is not set; pass --cert, --key and --ca") });
            };
            let pem = std::fs::read(&path).map_err(|e| Error::Tls {
                reason: format!(
                    "cannot read the {what} {}: {e}. A dpu-agent on this machine writes a development bundle to \
                     $DPUIO_CONFIG_DIR or ~/.config/dpuio on start; `dpuctl cert issue --tenant NAME --out DIR` makes \
                     one; or pass --cert/--key/--ca",
                    path.display()
                ),
            })?;
            pems.push(pem);
        }
        let [cert, key, ca] =
            <[Vec<u8>; 3]>::try_from(pems).map_err(|_| Error::Tls { reason: "internal: three files".into() })?;
        // Say which file is wrong here: rustls would only report a failed handshake.
        for (pem, marker, what) in [
            (&cert, "-----BEGIN CERTIFICATE-----", "client certificate"),
            (&key, "PRIVATE KEY-----", "client key"),
            (&ca, "-----BEGIN CERTIFICATE-----", "CA certificate"),
        ] {
            if !String::from_utf8_lossy(pem).contains(marker) {
                return Err(Error::Tls {
                    reason: format!(
                        "the {what} file holds no PEM block \"{marker}\": pass the files of a client bundle"
                    ),
                });
            }
        }
        let name =
            self.server_name.clone().unwrap_or_else(|| host.trim_start_matches('[').trim_end_matches(']').to_owned());
        Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(cert, key))
            .domain_name(name))
    }
}

/// How a file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    ReadOnly,
    ReadWrite,
}

/// How to reach and attach to the agent.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// `host:port` or `http://host:port`.
    pub agent: String,
    /// Tenant to attach as; honoured by agents without client authentication. Empty
    /// lets the agent choose its default tenant.
    pub tenant: String,
    /// Shown in the agent's logs and session list.
    pub client_name: String,
    pub connect_timeout: Duration,
    /// Set up the data plane (regions, rings) so files can be read and written; `None`
    /// attaches a control-only session (enough for `ls`, `mkdir`, ...).
    pub data_plane: Option<DataPlaneOptions>,
    /// Client certificate for mutual TLS (unused with an `http://` address).
    pub tls: TlsOptions,
    /// A capability token (from a parent's [`Client::delegate`]) that narrows what this
    /// session may do; empty for the tenant's full rights. `$DPUIO_TOKEN` by default.
    pub capability_token: String,
    /// How the client rides out an agent restart (see [`crate::resume`]).
    pub resume: ResumeOptions,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            agent: std::env::var("DPUIO_AGENT").unwrap_or_else(|_| DEFAULT_AGENT.to_owned()),
            tenant: String::new(),
            client_name: format!(
                "{} pid {}",
                std::env::args().next().unwrap_or_else(|| "dpuio".into()),
                std::process::id()
            ),
            connect_timeout: Duration::from_secs(5),
            data_plane: None,
            tls: TlsOptions::from_env(),
            capability_token: std::env::var("DPUIO_TOKEN").unwrap_or_default(),
            resume: ResumeOptions::default(),
        }
    }
}

struct Inner {
    /// The session on the agent now (a new one after each resume).
    session_id: AtomicU64,
    session: SessionClient<Channel>,
    namespace: NamespaceClient<Channel>,
    supervisor: tokio::task::JoinHandle<()>,
    data: Option<Arc<DataPlane>>,
    live: Arc<Liveness>,
    /// The open files (and, through the data plane, the regions) to restore.
    registry: Arc<Registry>,
    /// What attached the session, to attach again after an agent restart: the
    /// options, and the transport offered (this worker's address, which stays).
    options: ConnectOptions,
    offer: Option<pb::TransportInfo>,
    container: String,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.supervisor.abort();
    }
}

/// An attached session with its container mounted.
///
/// Cheap to clone; clones share the session. The lease is renewed in the background
/// while any clone (or open [`File`]) lives; [`Client::detach`] ends it at once,
/// otherwise the agent detaches it when the lease lapses.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    tenant: String,
    container: String,
    chunk_bytes: u64,
    limits: pb::Limits,
}

/// An open file handle.
pub struct File {
    inner: Arc<Inner>,
    handle: u64,
    path: String,
    attr: Attr,
    chunk_bytes: u64,
}

/// Where the agent is, as parsed from an address: the URL to dial and whether it is
/// plaintext.
fn agent_endpoint(address: &str) -> Result<(Endpoint, bool)> {
    let bad = |reason: String| Error::Address { address: address.to_owned(), reason };
    let (plaintext, rest) = match address.split_once("://") {
        Some(("http", rest)) => (true, rest),
        Some(("https", rest)) => (false, rest),
        Some((scheme, _)) => {
            return Err(bad(format!(
                "unknown scheme {scheme:?}: use HOST:PORT (mTLS) or http://HOST:PORT (plaintext)"
            )));
        }
        None => (false, address),
    };
    let url = format!("{}://{rest}", if plaintext { "http" } else { "https" });
    let endpoint = Endpoint::from_shared(url).map_err(|e| bad(e.to_string()))?;
    Ok((endpoint, plaintext))
}

/// Open the control-plane channel to the agent at `address`.
///
/// Reachability comes first: when the client bundle is not usable *and* nothing answers
/// at the address, the error is [`Error::Connect`] (UNAVAILABLE, worth retrying) and its
/// reason names the bundle problem too. An agent started on this machine writes the
/// development bundle when it starts, so a job launched before its agent has a reason to
/// wait and retry; telling such a user only about certificates would send them to the
/// wrong fix. When the agent does answer, a bad bundle is [`Error::Tls`]
/// (INVALID_ARGUMENT), as before. The same rule holds for the C ABI, Python and the CLI,
/// which all attach through here.
async fn connect_channel(address: &str, tls: &TlsOptions, timeout: Duration) -> Result<Channel> {
    let (endpoint, plaintext) = agent_endpoint(address)?;
    let endpoint = endpoint.connect_timeout(timeout).tcp_nodelay(true);
    let endpoint = if plaintext {
        endpoint
    } else {
        let uri = endpoint.uri().clone();
        let host = uri.host().unwrap_or("localhost").to_owned();
        let configured = tls
            .client_config(&host)
            .and_then(|config| endpoint.tls_config(config).map_err(|e| Error::Tls { reason: error_chain(&e) }));
        match configured {
            Ok(endpoint) => endpoint,
            Err(Error::Tls { reason }) => {
                return Err(match probe(&uri, timeout).await {
                    Ok(()) => Error::Tls { reason },
                    Err(unreachable) => Error::Connect {
                        address: address.to_owned(),
                        reason: format!("{unreachable}; besides, the client bundle is not usable: {reason}"),
                    },
                });
            }
            Err(other) => return Err(other),
        }
    };
    endpoint.connect().await.map_err(|source| connect_error(address, &source))
}

/// Whether anything accepts a TCP connection at `uri` within `timeout`.
async fn probe(uri: &tonic::transport::Uri, timeout: Duration) -> std::result::Result<(), String> {
    let host = uri.host().unwrap_or("localhost").trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(443);
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("tcp connect error: {e}")),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

/// Why a connection failed: an agent certificate this client does not trust is a TLS
/// setting to fix, not an agent that is down.
fn connect_error(address: &str, source: &tonic::transport::Error) -> Error {
    let reason = error_chain(source);
    if reason.contains("invalid peer certificate") {
        return Error::Tls {
            reason: format!(
                "the agent at {address} presented a certificate this client does not trust ({reason}): use the ca.pem of \
                 the agent that issued your bundle (--ca), or --tls-server-name with a name the certificate carries"
            ),
        };
    }
    if reason.contains("InvalidContentType") || reason.contains("corrupt message") {
        return Error::Tls {
            reason: format!(
                "the agent at {address} does not speak TLS ({reason}): an agent with [tls] mode = \"off\" is reached \
                 with http://{address}"
            ),
        };
    }
    Error::Connect { address: address.to_owned(), reason }
}

/// Why Attach, the first call on a channel, failed. A plaintext client (`http://`)
/// reaching an agent that serves mutual TLS gets only "operation was canceled", "h2
/// protocol error" or "transport error" from tonic (which one depends on timing): the
/// agent drops the connection at the HTTP/2 preface, before any answer.
fn attach_error(address: &str, status: tonic::Status) -> Error {
    let dropped = matches!(
        status.code(),
        tonic::Code::Cancelled | tonic::Code::Unknown | tonic::Code::Unavailable | tonic::Code::Internal
    ) && ["transport error", "h2 protocol error", "operation was canceled"]
        .iter()
        .any(|m| status.message().contains(m));
    if dropped && address.starts_with("http://") {
        return Error::Connect {
            address: address.to_owned(),
            reason: format!(
                "the agent closed the connection without an answer ({}); it most likely serves mutual TLS: \
                 connect to HOST:PORT without http:// with a client bundle (--cert/--key/--ca, or \
                 DPUIO_CONFIG_DIR); http:// is for agents with [tls] mode = \"off\"",
                status.message()
            ),
        };
    }
    Error::from_status("attach", status)
}

/// An error and its sources on one line: tonic's transport errors say little at the top.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

fn attr_from(op: &str, a: Option<pb::Attr>) -> Result<Attr> {
    let a = a.ok_or_else(|| Error::Protocol { op: op.to_owned(), reason: "attributes missing".into() })?;
    Attr::from_proto(&a)
        .ok_or_else(|| Error::Protocol { op: op.to_owned(), reason: format!("unknown entry kind {}", a.kind) })
}

/// Attributes from a metadata answer's record.
fn attr_of(op: &str, r: &wire::AttrRecord) -> Result<Attr> {
    Attr::from_record(r)
        .ok_or_else(|| Error::Protocol { op: op.to_owned(), reason: format!("unknown entry kind {}", r.kind) })
}

/// The header of a metadata answer (a view of the bytes the agent wrote).
fn meta_header(op: &str, answer: HostBytes<'_>) -> Result<wire::MetaHeader> {
    let mut b = [0u8; wire::META_ANSWER_HEADER_BYTES as usize];
    if answer.len() < b.len() {
        return Err(Error::Protocol { op: op.to_owned(), reason: format!("an answer of {} bytes", answer.len()) });
    }
    answer.slice(..b.len()).copy_to_slice(&mut b);
    wire::MetaHeader::decode(&b)
        .ok_or_else(|| Error::Protocol { op: op.to_owned(), reason: "a malformed answer".into() })
}

/// The records after a lookup's or listing's header, read once out of the answer.
struct Records {
    bytes: Vec<u8>,
    at: usize,
}

impl Records {
    fn take(&mut self, op: &str, n: usize) -> Result<&[u8]> {
        let bad = || Error::Protocol { op: op.to_owned(), reason: "an answer record runs past the answer".into() };
        let b = self.bytes.get(self.at..self.at.checked_add(n).ok_or_else(bad)?).ok_or_else(bad)?;
        self.at += n;
        Ok(b)
    }
    fn u16(&mut self, op: &str) -> Result<usize> {
        let b = self.take(op, 2)?;
        Ok(usize::from(u16::from_le_bytes([b[0], b[1]])))
    }
    fn u32(&mut self, op: &str) -> Result<u32> {
        let b = self.take(op, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn attr(&mut self, op: &str) -> Result<wire::AttrRecord> {
        let b = self.take(op, wire::ATTR_BYTES)?;
        Ok(wire::AttrRecord::decode(b).unwrap_or_default())
    }
    fn text(&mut self, op: &str, n: usize) -> Result<String> {
        let s = String::from_utf8_lossy(self.take(op, n)?).into_owned();
        Ok(s)
    }
    fn pad(&mut self) {
        self.at = wire::pad8(self.at);
    }
}

impl Client {
    /// Connect, attach and mount the tenant's container.
    pub async fn connect(options: ConnectOptions) -> Result<Client> {
        // A process linking the data plane carries libfabric's dependencies' load-time
        // handlers (SIGTERM and crashes exit 1): this host process ends as signalled.
        fabric::drop_load_time_signal_handlers();
        let channel = connect_channel(&options.agent, &options.tls, options.connect_timeout).await?;
        let mut session = SessionClient::new(channel.clone());
        let mut namespace = NamespaceClient::new(channel.clone());
        let candidates = match &options.data_plane {
            Some(dp) => dp.candidates()?,
            None => Vec::new(),
        };
        let mut offered = candidates.into_iter().peekable();
        let (prepared, attached) = loop {
            let prepared = match (options.data_plane.clone(), offered.next()) {
                (Some(dp), Some(spec)) => Some(
                    tokio::task::spawn_blocking(move || dataplane::prepare(dp, &spec))
                        .await
                        .map_err(|e| Error::DataPlane { op: "open the transport".into(), reason: e.to_string() })??,
                ),
                _ => None,
            };
            let attached = session
                .attach(pb::AttachRequest {
                    client_name: options.client_name.clone(),
                    tenant: options.tenant.clone(),
                    transport: prepared.as_ref().map(|p| p.transport_info()),
                    capability_token: options.capability_token.clone(),
                })
                .await;
            match attached {
                Ok(a) => break (prepared, a.into_inner()),
                // "auto": the agent does not run this provider; offer the next.
                Err(s)
                    if s.code() == tonic::Code::InvalidArgument
                        && s.message().contains("transport.provider")
                        && offered.peek().is_some() =>
                {
                    continue;
                }
                Err(s) => return Err(attach_error(&options.agent, s)),
            }
        };
        let session_id = attached.session_id;
        let mounted = namespace
            .mount(pb::MountRequest { session_id, container: attached.container.clone() })
            .await
            .map_err(|s| Error::from_status("mount", s))?
            .into_inner();
        let live = Arc::new(Liveness::new(options.resume.clone()));
        let offer = prepared.as_ref().map(|p| p.transport_info());
        let data = match prepared {
            Some(p) => {
                let agent = attached.agent_transport.as_ref().ok_or_else(|| Error::Protocol {
                    op: "attach".into(),
                    reason: "the agent accepted a transport but sent no worker address".into(),
                })?;
                Some(Arc::new(p.finish(session_id, &agent.worker_address, channel, live.clone()).await?))
            }
            None => None,
        };
        let registry = data.as_ref().map_or_else(|| Arc::new(Registry::default()), |d| d.registry().clone());
        let lease_ms = attached.lease_ms;
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| Inner {
            session_id: AtomicU64::new(session_id),
            session,
            namespace,
            supervisor: tokio::spawn(supervise(weak.clone(), live.clone(), lease_ms)),
            data,
            live,
            registry,
            options,
            offer,
            container: attached.container,
        });
        Ok(Client {
            inner,
            tenant: attached.tenant,
            container: mounted.container,
            chunk_bytes: mounted.chunk_bytes,
            limits: attached.limits.unwrap_or_default(),
        })
    }

    /// The session on the agent now (a new one each time the client resumes after an
    /// agent restart).
    pub fn session_id(&self) -> u64 {
        self.inner.session_id()
    }

    /// Run a control-plane call for the current session. If the agent did not run it
    /// (it restarted and does not know the session, or could not be reached), wait
    /// for the next word from the agent (the client attaches again in the meantime
    /// where it must) and send it again, for as long as the resume options allow.
    /// `idempotent` calls are also sent again after a connection lost mid-call.
    pub(crate) async fn call<T, F, Fut>(&self, op: &str, idempotent: bool, f: F) -> Result<T>
    where
        F: Fn(u64) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        self.inner.call(op, idempotent, f).await
    }

    /// A capability token for a child process (e.g. a DataLoader worker), narrower than
    /// this session's: paths under `prefix`, `operations` (any of "read", "write",
    /// "create", "delete"), for `lifetime_s` seconds; empty or 0 keep this session's.
    /// The child attaches with it in [`ConnectOptions::capability_token`]. Returns the
    /// token and its expiry in Unix seconds.
    pub async fn delegate(&self, prefix: &str, operations: &[String], lifetime_s: u64) -> Result<(String, i64)> {
        let r = self
            .call("delegate", true, |session_id| {
                let mut session = self.inner.session.clone();
                let request = pb::DelegateRequest {
                    session_id,
                    path_prefix: prefix.to_owned(),
                    operations: operations.to_vec(),
                    lifetime_s,
                };
                async move { session.delegate(request).await }
            })
            .await?;
        Ok((r.capability_token, r.expires_unix_s))
    }
    pub fn tenant(&self) -> &str {
        &self.tenant
    }
    pub fn container(&self) -> &str {
        &self.container
    }
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }
    /// The limits the agent applies to this session.
    pub fn limits(&self) -> &pb::Limits {
        &self.limits
    }

    pub(crate) fn ns(&self) -> NamespaceClient<Channel> {
        self.inner.namespace.clone()
    }

    /// The data plane, when this session has one: metadata then goes over the ring.
    /// (Not once the session is known to have ended: gRPC then says why.)
    fn ring(&self) -> Option<&Arc<DataPlane>> {
        self.inner.data.as_ref().filter(|d| !d.is_ended())
    }

    /// Attributes of a path (over the ring when the session has a data plane).
    pub async fn stat(&self, path: &str) -> Result<Attr> {
        let op = format!("stat {path}");
        if let Some(dp) = self.ring() {
            let call = MetaCall { opcode: MetaOpcode::Stat, flags: 0, handle: 0, strings: &[path], arg: 0 };
            let r = dp.metadata(&op, &call, AnswerTo::RING, |answer| attr_of(&op, &meta_header(&op, answer)?.attr));
            if r.is_ok() || !dp.is_ended() {
                return r;
            } // the session ended while waiting: gRPC says why
        }
        let r = self
            .call(&op, true, |session_id| {
                let mut ns = self.ns();
                let request =
                    pb::StatRequest { session_id, target: Some(pb::stat_request::Target::Path(path.to_owned())) };
                async move { ns.stat(request).await }
            })
            .await?;
        attr_from(&op, r.attr)
    }

    /// Attributes of many paths in as few calls as the agent's limit allows; each path
    /// gets its own result.
    pub async fn lookup(&self, paths: &[String]) -> Result<Vec<Result<Attr>>> {
        let mut out = Vec::with_capacity(paths.len());
        let per_call = (self.limits.max_lookup_paths as usize).max(1);
        if let Some(dp) = self.ring() {
            // As many paths per entry as the agent's limit, the request area and (at
            // a generous 256 bytes a record) the answer area allow.
            let mut rest = paths;
            while !rest.is_empty() {
                let mut n = 0;
                let mut bytes = 0;
                while n < rest.len()
                    && n < per_call
                    && n < ring_meta::ANSWER_BYTES / 256
                    && bytes + 2 + rest[n].len() <= ring_meta::REQUEST_BYTES
                {
                    bytes += 2 + rest[n].len();
                    n += 1;
                }
                if n == 0 {
                    // One path longer than the request area: let gRPC answer it.
                    out.extend(Box::pin(self.lookup_grpc(&rest[..1])).await?);
                    rest = &rest[1..];
                    continue;
                }
                let (chunk, next) = rest.split_at(n);
                out.extend(self.lookup_ring(dp, chunk)?);
                rest = next;
            }
            return Ok(out);
        }
        out.extend(self.lookup_grpc(paths).await?);
        Ok(out)
    }

    fn lookup_ring(&self, dp: &Arc<DataPlane>, paths: &[String]) -> Result<Vec<Result<Attr>>> {
        let strings: Vec<&str> = paths.iter().map(String::as_str).collect();
        let call =
            MetaCall { opcode: MetaOpcode::Lookup, flags: 0, handle: 0, strings: &strings, arg: paths.len() as u32 };
        dp.metadata("lookup", &call, AnswerTo::RING, |answer| {
            let header = meta_header("lookup", answer)?;
            if header.count != paths.len() as u64 {
                return Err(Error::Protocol { op: "lookup".into(), reason: format!("{} results", header.count) });
            }
            let bytes = answer.to_vec();
            let mut r = Records { bytes, at: wire::META_ANSWER_HEADER_BYTES as usize };
            paths
                .iter()
                .map(|path| {
                    let op = format!("lookup {path}");
                    let code = r.u32(&op)?;
                    let len = r.u32(&op)? as usize;
                    let attr = r.attr(&op)?;
                    let message = r.text(&op, len)?;
                    r.pad();
                    Ok(match code {
                        0 => attr_of(&op, &attr),
                        code => Err(Error::agent(op, wire::CodeWord::from_u32(code), message)),
                    })
                })
                .collect()
        })
    }

    async fn lookup_grpc(&self, paths: &[String]) -> Result<Vec<Result<Attr>>> {
        let mut out = Vec::with_capacity(paths.len());
        let per_call = (self.limits.max_lookup_paths as usize).max(1);
        for chunk in paths.chunks(per_call) {
            let r = self
                .call("lookup", true, |session_id| {
                    let mut ns = self.ns();
                    let request = pb::LookupRequest { session_id, paths: chunk.to_vec() };
                    async move { ns.lookup(request).await }
                })
                .await?;
            for result in r.results {
                let op = format!("lookup {}", result.path);
                out.push(match result.result {
                    Some(pb::lookup_result::Result::Attr(a)) => attr_from(&op, Some(a)),
                    Some(pb::lookup_result::Result::Error(message)) => {
                        Err(Error::Agent { op, code: tonic::Code::from_i32(result.code), message, reason: None })
                    }
                    None => Err(Error::Protocol { op, reason: "empty result".into() }),
                });
            }
        }
        Ok(out)
    }

    /// Create a directory (with `parents`, also its missing ancestors, like `mkdir -p`).
    pub async fn mkdir(&self, path: &str, parents: bool) -> Result<Attr> {
        let op = format!("mkdir {path}");
        // `mkdir -p` may run twice; a plain mkdir that ran would then fail with "exists".
        let r = self
            .call(&op, parents, |session_id| {
                let mut ns = self.ns();
                let request = pb::MkdirRequest { session_id, path: path.to_owned(), mode: 0, parents };
                async move { ns.mkdir(request).await }
            })
            .await?;
        attr_from(&op, r.attr)
    }

    /// Stream a directory in batches; `each` sees every batch in order, so a huge
    /// directory never has to fit in memory. Starts after `anchor` if given.
    pub async fn readdir_batches(
        &self,
        path: &str,
        anchor: Option<&str>,
        batch_size: u32,
        mut each: impl FnMut(Vec<DirEntry>) -> Result<()>,
    ) -> Result<()> {
        let op = format!("readdir {path}");
        if let Some(dp) = self.ring() {
            let mut anchor = anchor.unwrap_or_default().to_owned();
            loop {
                let call = MetaCall {
                    opcode: MetaOpcode::Readdir,
                    flags: 0,
                    handle: 0,
                    strings: &[path, &anchor],
                    arg: batch_size,
                };
                let (entries, next) = dp.metadata(&op, &call, AnswerTo::RING, |answer| {
                    let header = meta_header(&op, answer)?;
                    let bytes = answer.to_vec();
                    let mut r = Records { bytes, at: wire::META_ANSWER_HEADER_BYTES as usize };
                    let mut entries = Vec::with_capacity(header.count.min(1 << 16) as usize);
                    for _ in 0..header.count {
                        let len = r.u16(&op)?;
                        r.take(&op, 6)?;
                        let attr = attr_of(&op, &r.attr(&op)?)?;
                        let name = r.text(&op, len)?;
                        r.pad();
                        entries.push(DirEntry { name, attr });
                    }
                    let len = r.u16(&op)?;
                    let next = r.text(&op, len)?;
                    Ok((entries, header.more.then_some(next)))
                })?;
                each(entries)?;
                match next {
                    Some(next) => anchor = next,
                    None => return Ok(()),
                }
            }
        }
        let mut stream = self
            .call(&op, true, |session_id| {
                let mut ns = self.ns();
                let request = pb::ReaddirRequest {
                    session_id,
                    path: path.to_owned(),
                    anchor: anchor.unwrap_or_default().to_owned(),
                    batch_size,
                };
                async move { ns.readdir(request).await }
            })
            .await?;
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(|s| Error::from_status(&op, s))?;
            let entries = batch
                .entries
                .into_iter()
                .map(|e| Ok(DirEntry { attr: attr_from(&op, e.attr)?, name: e.name }))
                .collect::<Result<Vec<_>>>()?;
            each(entries)?;
            if batch.done {
                break;
            }
        }
        Ok(())
    }

    /// A whole directory listing, in name order.
    pub async fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let mut all = Vec::new();
        self.readdir_batches(path, None, 0, |batch| {
            all.extend(batch);
            Ok(())
        })
        .await?;
        Ok(all)
    }

    /// Open an existing file.
    pub async fn open(&self, path: &str, access: Access) -> Result<File> {
        let op = format!("open {path}");
        if self.ring().is_some() {
            let flags = if access == Access::ReadWrite { wire::META_WRITE } else { 0 };
            return self.open_ring(&op, path, MetaOpcode::Open, flags, 0);
        }
        let r = self
            .call(&op, true, |session_id| {
                let mut ns = self.ns();
                let request = pb::OpenRequest {
                    session_id,
                    path: path.to_owned(),
                    access: match access {
                        Access::ReadOnly => pb::Access::ReadOnly,
                        Access::ReadWrite => pb::Access::ReadWrite,
                    } as i32,
                    truncate: false,
                    handle: 0,
                };
                async move { ns.open(request).await }
            })
            .await?;
        self.file(&op, path, access == Access::ReadWrite, r)
    }

    /// Create a file (or, unless `exclusive`, truncate an existing one) and open it
    /// for writing.
    pub async fn create(&self, path: &str, exclusive: bool) -> Result<File> {
        let op = format!("create {path}");
        if self.ring().is_some() {
            let flags = if exclusive { wire::META_EXCLUSIVE } else { 0 };
            return self.open_ring(&op, path, MetaOpcode::Create, flags, 0);
        }
        let r = self
            .call(&op, !exclusive, |session_id| {
                let mut ns = self.ns();
                let request = pb::CreateRequest { session_id, path: path.to_owned(), exclusive, ..Default::default() };
                async move { ns.create(request).await }
            })
            .await?;
        self.file(&op, path, true, r)
    }

    /// Open or create over the ring: the handle is an ordinary session handle.
    fn open_ring(&self, op: &str, path: &str, opcode: MetaOpcode, flags: u16, mode: u32) -> Result<File> {
        let dp = self.data()?;
        let call = MetaCall { opcode, flags, handle: 0, strings: &[path], arg: mode };
        let header = dp.metadata(op, &call, AnswerTo::RING, |answer| meta_header(op, answer))?;
        let write = opcode == MetaOpcode::Create || flags & wire::META_WRITE != 0;
        Ok(File::opened(&self.inner, header.handle, path, write, attr_of(op, &header.attr)?, header.chunk_bytes))
    }

    /// The whole file at `path` in one submission where it fits the ring's answer
    /// area (512 KiB): the agent opens it, reads it into this process's memory and
    /// closes it. A larger file goes on with an open, reads and a close. Blocking on
    /// the ring; without a data plane this fails like any data-plane call.
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let dp = self.data()?;
        let (attr, mut data) = self.read_head(path, ring_meta::ANSWER_BYTES - 64)?;
        if (data.len() as u64) < attr.size && data.len() == ring_meta::ANSWER_BYTES - 64 {
            // Longer than the answer area: read the rest through a handle.
            let file = self.open_ring(&format!("open {path}"), path, MetaOpcode::Open, 0, 0)?;
            let rest = file.read_rest(dp, &mut data, attr.size);
            let closed = file.close_blocking();
            rest?;
            closed?;
        }
        Ok(data)
    }

    /// The attributes of the file at `path` and its first bytes, at most `max_bytes`
    /// (up to 512 KiB - 64), in one submission: the agent opens it, reads them into this
    /// process's memory and closes it. The whole file when `attr.size` is the length
    /// returned. Blocking on the ring.
    pub fn read_head(&self, path: &str, max_bytes: usize) -> Result<(Attr, Vec<u8>)> {
        let op = format!("read {path}");
        let dp = self.data()?;
        let call = MetaCall { opcode: MetaOpcode::OpenRead, flags: 0, handle: 0, strings: &[path], arg: 0 };
        let room = (max_bytes + wire::META_ANSWER_HEADER_BYTES as usize).min(ring_meta::ANSWER_BYTES) as u32;
        dp.metadata(&op, &call, AnswerTo::Ring(room), |answer| {
            let header = meta_header(&op, answer)?;
            let start = wire::META_ANSWER_HEADER_BYTES as usize;
            let count = header.count.min((answer.len() - start) as u64) as usize;
            let data = answer.slice(start..start + count).to_vec();
            Ok((attr_of(&op, &header.attr)?, data))
        })
    }

    /// A training sample in one submission: the agent opens `path`, reads it into
    /// `region` at `offset + 64` (up to `length - 64` bytes) and closes it, and writes
    /// the file's attributes before it (a 64-byte header). Returns the attributes and
    /// the bytes read, which start at `offset + 64`. No byte passes through this
    /// process's CPU. Blocking.
    pub fn read_sample(&self, path: &str, region: &RegisteredRegion, offset: u64, length: u32) -> Result<(Attr, u64)> {
        let op = format!("read {path}");
        let call = MetaCall { opcode: MetaOpcode::OpenRead, flags: 0, handle: 0, strings: &[path], arg: 0 };
        self.data()?.metadata(&op, &call, AnswerTo::Region(region, offset, length), |answer| {
            let header = meta_header(&op, answer)?;
            Ok((attr_of(&op, &header.attr)?, header.count))
        })
    }

    /// A batch of training samples in one submission: for each `(path, offset,
    /// length)`, what [`Client::read_sample`] does, into ranges of one `region` that
    /// must not overlap. One doorbell and one wait for the batch (a loader's batch of
    /// samples costs this process about one sleep and wake-up, not one per sample).
    /// Each sample gets its own result, in order: a missing file fails alone. Batches
    /// larger than a ring go out in several submissions. Blocking.
    pub fn read_samples(
        &self,
        region: &RegisteredRegion,
        samples: &[(&str, u64, u32)],
    ) -> Result<Vec<Result<(Attr, u64)>>> {
        let strings: Vec<[&str; 1]> = samples.iter().map(|&(path, ..)| [path]).collect();
        let calls: Vec<_> = samples
            .iter()
            .zip(&strings)
            .map(|(&(path, offset, length), strings)| {
                let call = MetaCall { opcode: MetaOpcode::OpenRead, flags: 0, handle: 0, strings, arg: 0 };
                (format!("read {path}"), call, (region, offset, length))
            })
            .collect();
        self.data()?.metadata_batch(&calls, |op, answer| {
            let header = meta_header(op, answer)?;
            Ok((attr_of(op, &header.attr)?, header.count))
        })
    }

    fn file(&self, op: &str, path: &str, write: bool, r: pb::OpenResponse) -> Result<File> {
        Ok(File::opened(&self.inner, r.handle, path, write, attr_from(op, r.attr)?, r.chunk_bytes))
    }

    /// Remove a file or an empty directory; `recursive` removes a whole tree.
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        self.call(&format!("remove {path}"), false, |session_id| {
            let mut ns = self.ns();
            let request = pb::RemoveRequest { session_id, path: path.to_owned(), recursive };
            async move { ns.remove(request).await }
        })
        .await?;
        Ok(())
    }

    /// Rename; fails if `to` exists.
    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.call(&format!("rename {from} to {to}"), false, |session_id| {
            let mut ns = self.ns();
            let request = pb::RenameRequest { session_id, from: from.to_owned(), to: to.to_owned(), replace: false };
            async move { ns.rename(request).await }
        })
        .await?;
        Ok(())
    }

    /// Set a file's size by path.
    pub async fn truncate(&self, path: &str, size: u64) -> Result<()> {
        self.call(&format!("truncate {path}"), true, |session_id| {
            let mut ns = self.ns();
            let request = pb::TruncateRequest {
                session_id,
                target: Some(pb::truncate_request::Target::Path(path.to_owned())),
                size,
            };
            async move { ns.truncate(request).await }
        })
        .await?;
        Ok(())
    }

    /// Make every acknowledged change in the container durable.
    pub async fn sync(&self) -> Result<()> {
        self.call("sync", true, |session_id| {
            let mut ns = self.ns();
            async move { ns.sync(pb::SyncRequest { session_id, handle: 0 }).await }
        })
        .await?;
        Ok(())
    }

    /// A batch of data-plane requests on a ring of its own (blocking calls).
    pub fn batch(&self) -> Result<Batch> {
        Ok(self.data()?.batch())
    }

    fn data(&self) -> Result<&Arc<DataPlane>> {
        self.inner.data.as_ref().ok_or_else(|| Error::DataPlane {
            op: "data plane".into(),
            reason: "this client attached without a data plane; set ConnectOptions::data_plane".into(),
        })
    }

    /// Allocate `length` bytes through the transport and register them with the agent.
    /// `access` says which way the agent may move data (reads land in WRITE_BY_AGENT
    /// regions, writes come from READ_BY_AGENT ones; READ_WRITE for both).
    pub async fn register_region(&self, length: usize, access: pb::RegionAccess) -> Result<RegisteredRegion> {
        let dp = self.data()?;
        let live = &self.inner.live;
        let deadline = Instant::now() + live.options.max_wait;
        loop {
            let seen = live.epoch();
            match dp.register(length, access).await {
                // Registered in a session the agent had forgotten: again in the next.
                Err(e @ Error::Agent { reason: Some(dpuio_proto::reason::Reason::NoSession), .. })
                    if live.options.enabled() && Instant::now() < deadline =>
                {
                    live.next_probe(seen).await.map_err(|why| Error::DataPlane { op: e.to_string(), reason: why })?;
                }
                r => return r,
            }
        }
    }

    /// Tell the agent to forget a region, then free it.
    pub async fn deregister_region(&self, region: RegisteredRegion) -> Result<()> {
        self.data()?.deregister(region).await
    }

    /// A pool of `count` registered buffers of `buffer_bytes` each.
    pub async fn region_pool(&self, buffer_bytes: usize, count: usize) -> Result<RegionPool> {
        let mut free = Vec::with_capacity(count);
        for _ in 0..count {
            free.push(self.register_region(buffer_bytes, pb::RegionAccess::ReadWrite).await?);
        }
        Ok(RegionPool {
            shared: Arc::new(PoolShared { free: std::sync::Mutex::new(free), returned: std::sync::Condvar::new() }),
        })
    }

    /// Submit a batch of requests through one ring and wait for all of them (blocking:
    /// from async code use [`Client::submit`]).
    pub fn submit_blocking(&self, requests: &[Request]) -> Result<Vec<Done>> {
        self.data()?.run(requests)
    }

    /// [`Client::submit_blocking`] on the blocking pool.
    pub async fn submit(&self, requests: Vec<Request>) -> Result<Vec<Done>> {
        let client = self.clone();
        tokio::task::spawn_blocking(move || client.submit_blocking(&requests))
            .await
            .map_err(|e| Error::DataPlane { op: "submit".into(), reason: e.to_string() })?
    }

    /// The data plane's transport (what `"auto"` chose); `None` without a data plane.
    pub fn transport(&self) -> Option<crate::TransportInfo> {
        self.inner.data.as_ref().map(|d| d.transport())
    }

    /// CPU time the data plane's progress thread has used (zero on shared memory).
    pub fn data_plane_stats(&self) -> DataPlaneStats {
        self.inner.data.as_ref().map(|d| d.stats()).unwrap_or_default()
    }

    /// End the session now (its written handles are synced by the agent). A session
    /// the agent no longer knows (it restarted, or reaped it) counts as ended.
    pub async fn detach(self) -> Result<()> {
        self.inner.supervisor.abort();
        let mut session = self.inner.session.clone();
        match session.detach(pb::DetachRequest { session_id: self.session_id() }).await {
            // An agent that restarted (or reaped it) no longer has the session: ended.
            Err(s) if resume::classify(&Err(s.clone())) == Probe::Forgotten => Ok(()),
            Err(s) => Err(Error::from_status("detach", s)),
            Ok(_) => Ok(()),
        }
    }
}

impl File {
    /// A file the agent opened as `handle`: kept in the session's registry, to be
    /// opened again under the same handle after an agent restart.
    fn opened(inner: &Arc<Inner>, handle: u64, path: &str, write: bool, attr: Attr, chunk_bytes: u64) -> File {
        inner.registry.add_file(handle, FileRecord { path: path.to_owned(), write });
        File { inner: inner.clone(), handle, path: path.to_owned(), attr, chunk_bytes }
    }

    /// A control-plane call on this file's handle (see [`Client::call`]).
    async fn call<T, F, Fut>(&self, op: &str, f: F) -> Result<T>
    where
        F: Fn(u64) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        self.inner.call(op, true, f).await
    }

    pub fn handle(&self) -> u64 {
        self.handle
    }
    pub fn path(&self) -> &str {
        &self.path
    }
    /// Attributes as of open.
    pub fn attr(&self) -> &Attr {
        &self.attr
    }
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// Current attributes (over the ring when the session has a data plane).
    pub async fn stat(&self) -> Result<Attr> {
        let op = format!("stat {}", self.path);
        if let Some(dp) = &self.inner.data {
            let call = MetaCall { opcode: MetaOpcode::StatHandle, flags: 0, handle: self.handle, strings: &[], arg: 0 };
            return dp.metadata(&op, &call, AnswerTo::RING, |answer| attr_of(&op, &meta_header(&op, answer)?.attr));
        }
        let r = self
            .call(&op, |session_id| {
                let mut ns = self.inner.namespace.clone();
                let request =
                    pb::StatRequest { session_id, target: Some(pb::stat_request::Target::Handle(self.handle)) };
                async move { ns.stat(request).await }
            })
            .await?;
        attr_from(&op, r.attr)
    }

    /// Set the size through the handle (needs write access).
    pub async fn truncate(&self, size: u64) -> Result<()> {
        self.call(&format!("truncate {}", self.path), |session_id| {
            let mut ns = self.inner.namespace.clone();
            let request = pb::TruncateRequest {
                session_id,
                target: Some(pb::truncate_request::Target::Handle(self.handle)),
                size,
            };
            async move { ns.truncate(request).await }
        })
        .await?;
        Ok(())
    }

    /// Make this file durable.
    pub async fn sync(&self) -> Result<()> {
        self.call(&format!("sync {}", self.path), |session_id| {
            let mut ns = self.inner.namespace.clone();
            let handle = self.handle;
            async move { ns.sync(pb::SyncRequest { session_id, handle }).await }
        })
        .await?;
        Ok(())
    }

    /// A request reading `length` bytes at `file_offset` into `region` at `region_offset`.
    pub fn read_request(
        &self,
        region: &RegisteredRegion,
        region_offset: u64,
        length: u64,
        file_offset: u64,
    ) -> Request {
        Request {
            opcode: Opcode::Read,
            handle: self.handle,
            region_id: region.id(),
            region_offset,
            file_offset,
            length,
            sync: false,
            user_data: file_offset,
        }
    }

    /// A request writing `length` bytes from `region` at `region_offset` to `file_offset`.
    pub fn write_request(
        &self,
        region: &RegisteredRegion,
        region_offset: u64,
        length: u64,
        file_offset: u64,
    ) -> Request {
        Request { opcode: Opcode::Write, ..self.read_request(region, region_offset, length, file_offset) }
    }

    fn one(&self, op: &str, request: Request) -> Result<u64> {
        let data = self.inner.data.as_ref().ok_or_else(|| Error::DataPlane {
            op: op.into(),
            reason: "this client attached without a data plane; set ConnectOptions::data_plane".into(),
        })?;
        let done = data.run(&[request])?;
        let d = done.first().ok_or_else(|| Error::Protocol { op: op.into(), reason: "no completion".into() })?;
        d.result.map_err(|status| Error::Io { op: format!("{op} {}", self.path), status })
    }

    /// Read into the whole region at `file_offset`; returns the bytes read (short only
    /// at end of file). Blocking: the agent puts the bytes straight into the region.
    pub fn read_at(&self, region: &RegisteredRegion, file_offset: u64) -> Result<u64> {
        self.one("read", self.read_request(region, 0, region.len() as u64, file_offset))
    }

    /// Write `length` bytes from the start of the region at `file_offset`. Blocking.
    pub fn write_at(&self, region: &RegisteredRegion, length: u64, file_offset: u64) -> Result<u64> {
        self.one("write", self.write_request(region, 0, length, file_offset))
    }

    /// Read from `data.len()` up to `size` bytes into `data` (the rest of a file
    /// larger than one open-read answer).
    fn read_rest(&self, dp: &Arc<DataPlane>, data: &mut Vec<u8>, size: u64) -> Result<()> {
        dp.read_through_ring(&format!("read {}", self.path), self.handle, data, size)
    }

    fn close_blocking(self) -> Result<()> {
        let op = format!("close {}", self.path);
        let dp = self
            .inner
            .data
            .as_ref()
            .ok_or_else(|| Error::DataPlane { op: op.clone(), reason: "no data plane".into() })?;
        let call = MetaCall { opcode: MetaOpcode::Close, flags: 0, handle: self.handle, strings: &[], arg: 0 };
        dp.metadata(&op, &call, AnswerTo::RING, |_| Ok(()))
    }

    /// Close the handle; a written file is durable once this returns (over the ring
    /// when the session has a data plane).
    pub async fn close(self) -> Result<()> {
        if self.inner.data.is_some() {
            return self.close_blocking();
        }
        self.call(&format!("close {}", self.path), |session_id| {
            let mut ns = self.inner.namespace.clone();
            let handle = self.handle;
            async move { ns.close(pb::CloseRequest { session_id, handle }).await }
        })
        .await?;
        Ok(())
    }
}

impl Drop for File {
    fn drop(&mut self) {
        // Closed, or no longer anyone's to use: not to be opened again on a resume.
        self.inner.registry.remove_file(self.handle);
    }
}

/// Keep the session alive, and ride out an agent restart: renew the lease at a third
/// of it; when a renewal (or a probe asked for by a quiet wait, [`Liveness::suspect`])
/// finds the agent unreachable, ask every 100 ms; when the agent says it does not know
/// the session, attach again ([`Inner::resume`]). Gives up after
/// [`ResumeOptions::max_wait`] without an agent, or at once when the agent ended the
/// session for good (or resuming is off), so that waiting calls say why.
async fn supervise(inner: Weak<Inner>, live: Arc<Liveness>, lease_ms: u64) {
    let mut unreachable_since: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(resume::probe_period(lease_ms, unreachable_since.is_some())) => {}
            _ = live.suspected() => {}
        }
        let Some(inner) = inner.upgrade() else { return };
        let session_id = inner.session_id();
        let answer = tokio::time::timeout(
            Duration::from_secs(2),
            inner.session.clone().keep_alive(pb::KeepAliveRequest { session_id }),
        )
        .await
        .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("no answer to a keep-alive within 2 s")))
        .map(|_| ());
        let resuming = live.options.enabled();
        let outcome = match resume::classify(&answer) {
            Probe::Alive => {
                if unreachable_since.take().is_some() {
                    tracing::info!(session = format!("{session_id:#018x}"), "the agent answers again");
                }
                Ok(())
            }
            Probe::Unreachable => Err(answer.err().map(|s| s.message().to_owned()).unwrap_or_default()),
            Probe::Forgotten if resuming => match inner.resume().await {
                Ok(()) => {
                    unreachable_since = None;
                    Ok(())
                }
                Err(e)
                    if e.code().is_some_and(|c| {
                        matches!(
                            c,
                            tonic::Code::PermissionDenied | tonic::Code::Unauthenticated | tonic::Code::InvalidArgument
                        )
                    }) =>
                {
                    inner.give_up(format!("the agent restarted and refused to attach this client again: {e}"));
                    return;
                }
                Err(e) => Err(format!("attaching again: {e}")),
            },
            Probe::Forgotten | Probe::Ended => {
                // The session is gone (detached, lease lapsed, tenant removed): the agent
                // no longer serves its rings, so ring calls waiting now say why instead
                // of waiting out their timeout; gRPC calls say so themselves.
                if let (Some(data), Err(status)) = (&inner.data, answer) {
                    data.session_ended(status);
                }
                live.probed();
                return;
            }
        };
        if let Err(why) = outcome {
            let since = *unreachable_since.get_or_insert_with(|| {
                tracing::warn!(agent = %inner.options.agent, error = %why, "the agent does not answer; waiting for it");
                Instant::now()
            });
            if resuming && since.elapsed() >= live.options.max_wait {
                inner.give_up(format!(
                    "the agent at {} has not come back within {:?} (DPUIO_RESUME_S): {why}",
                    inner.options.agent, live.options.max_wait
                ));
                return;
            }
        }
        live.probed();
    }
}

impl Inner {
    fn session_id(&self) -> u64 {
        self.session_id.load(Ordering::Acquire)
    }

    /// See [`Client::call`].
    async fn call<T, F, Fut>(&self, op: &str, idempotent: bool, f: F) -> Result<T>
    where
        F: Fn(u64) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let deadline = Instant::now() + self.live.options.max_wait;
        loop {
            let seen = self.live.epoch();
            match f(self.session_id()).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s)
                    if self.live.options.enabled()
                        && resume::worth_resending(&s, idempotent)
                        && Instant::now() < deadline =>
                {
                    self.live
                        .next_probe(seen)
                        .await
                        .map_err(|why| Error::from_status(op, tonic::Status::unavailable(why)))?;
                }
                Err(s) => return Err(Error::from_status(op, s)),
            }
        }
    }

    /// Attach again to an agent that no longer knows the session: a new session with
    /// the same options and transport, the container mounted, every region registered
    /// and every open file re-opened under its id, fresh rings. Then calls and waiting
    /// rings move to it.
    async fn resume(&self) -> Result<()> {
        let old = self.session_id();
        let attached = self
            .session
            .clone()
            .attach(pb::AttachRequest {
                client_name: self.options.client_name.clone(),
                tenant: self.options.tenant.clone(),
                transport: self.offer.clone(),
                capability_token: self.options.capability_token.clone(),
            })
            .await
            .map_err(|s| Error::from_status("attach again", s))?
            .into_inner();
        let session_id = attached.session_id;
        let restored = self.restore(session_id, &attached).await;
        let reattached = match restored {
            Ok(r) => r,
            Err(e) => {
                // Leave no half-restored session behind.
                let _ = self.session.clone().detach(pb::DetachRequest { session_id }).await;
                return Err(e);
            }
        };
        self.session_id.store(session_id, Ordering::Release);
        match (&self.data, reattached) {
            (Some(dp), Some(r)) => dp.install(r),
            _ => self.live.resumed(),
        }
        tracing::info!(
            old = format!("{old:#018x}"),
            new = format!("{session_id:#018x}"),
            files = self.registry.files().len(),
            "attached again after the agent restarted"
        );
        Ok(())
    }

    async fn restore(&self, session_id: u64, attached: &pb::AttachResponse) -> Result<Option<dataplane::Reattached>> {
        let mut ns = self.namespace.clone();
        ns.mount(pb::MountRequest { session_id, container: self.container.clone() })
            .await
            .map_err(|s| Error::from_status("mount again", s))?;
        let reattached = match &self.data {
            Some(dp) => {
                let agent = attached.agent_transport.as_ref().ok_or_else(|| Error::Protocol {
                    op: "attach again".into(),
                    reason: "the agent accepted the transport but sent no worker address".into(),
                })?;
                Some(dp.reattach(session_id, &agent.worker_address).await?)
            }
            None => None,
        };
        for (handle, file) in self.registry.files() {
            let access = if file.write { pb::Access::ReadWrite } else { pb::Access::ReadOnly };
            let request =
                pb::OpenRequest { session_id, path: file.path.clone(), access: access as i32, truncate: false, handle };
            if let Err(s) = ns.open(request).await {
                // Gone or no longer allowed: requests on it fail as on a closed handle.
                tracing::warn!(path = %file.path, error = %s.message(), "cannot open a file again after the agent restarted");
            }
        }
        Ok(reattached)
    }

    /// Stop waiting for the agent: calls and waiting rings fail with `why`.
    fn give_up(&self, why: String) {
        tracing::error!(agent = %self.options.agent, "{why}");
        if let Some(data) = &self.data {
            data.session_ended(tonic::Status::unavailable(why.clone()));
        }
        self.live.give_up(why);
    }
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("handle", &format_args!("{:#018x}", self.handle))
            .field("path", &self.path)
            .finish()
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("session_id", &format_args!("{:#018x}", self.inner.session_id()))
            .field("tenant", &self.tenant)
            .field("container", &self.container)
            .finish()
    }
}

struct PoolShared {
    free: std::sync::Mutex<Vec<RegisteredRegion>>,
    returned: std::sync::Condvar,
}

/// Registered buffers handed out without a round trip to the agent; a [`Buffer`]
/// goes back to the pool when dropped.
#[derive(Clone)]
pub struct RegionPool {
    shared: Arc<PoolShared>,
}

impl RegionPool {
    /// A free buffer, waiting for one if all are in use.
    pub fn get(&self) -> Buffer {
        let mut free = self.shared.free.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(region) = free.pop() {
                return Buffer { region: Some(region), pool: self.shared.clone() };
            }
            free = self.shared.returned.wait(free).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// A free buffer, or `None` if all are in use.
    pub fn try_get(&self) -> Option<Buffer> {
        let region = self.shared.free.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
        Some(Buffer { region: Some(region), pool: self.shared.clone() })
    }
}

/// A registered buffer from a [`RegionPool`].
pub struct Buffer {
    region: Option<RegisteredRegion>,
    pool: Arc<PoolShared>,
}

impl std::ops::Deref for Buffer {
    type Target = RegisteredRegion;
    fn deref(&self) -> &RegisteredRegion {
        self.region.as_ref().expect("a live buffer holds its region")
    }
}

impl std::ops::DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut RegisteredRegion {
        self.region.as_mut().expect("a live buffer holds its region")
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(region) = self.region.take() {
            self.pool.free.lock().unwrap_or_else(|p| p.into_inner()).push(region);
            self.pool.returned.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Options for `address` whose client bundle directory does not exist, whatever is
    /// in the home directory or the environment of the test process.
    fn without_bundle(address: &str) -> ConnectOptions {
        let missing = std::env::temp_dir().join(format!("dpuio-no-bundle-{}", std::process::id()));
        ConnectOptions {
            agent: address.to_owned(),
            tls: TlsOptions::bundle(missing),
            connect_timeout: Duration::from_secs(2),
            capability_token: String::new(),
            ..ConnectOptions::default()
        }
    }

    fn connect_error_of(options: ConnectOptions) -> Error {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        match runtime.block_on(Client::connect(options)) {
            Ok(_) => panic!("connected with no agent and no client bundle"),
            Err(e) => e,
        }
    }

    #[test]
    fn no_bundle_and_no_agent_is_unreachable_and_names_the_bundle() {
        let e = connect_error_of(without_bundle("127.0.0.1:1"));
        let text = e.to_string();
        assert!(matches!(e, Error::Connect { .. }), "{e:?}");
        assert!(text.starts_with("cannot reach the agent at 127.0.0.1:1: "), "{text}");
        assert!(text.contains("the client bundle is not usable: cannot read the client certificate"), "{text}");
    }

    #[test]
    fn no_bundle_with_something_listening_is_a_tls_setting() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let e = connect_error_of(without_bundle(&address));
        assert!(matches!(e, Error::Tls { .. }), "{e:?}");
        assert!(e.to_string().contains("cannot read the client certificate"), "{e}");
    }

    #[test]
    fn plaintext_without_an_agent_is_unreachable() {
        let e = connect_error_of(without_bundle("http://127.0.0.1:1"));
        assert!(matches!(e, Error::Connect { .. }), "{e:?}");
        assert!(!e.to_string().contains("bundle"), "a plaintext address needs no bundle: {e}");
    }
}
