//! `dpuctl`: the operator's command line for a running `dpu-agent`, over the agent's
//! admin Unix socket (only the agent's user and root may use it).
#![forbid(unsafe_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use dpuio_proto::v1 as pb;
use pb::admin_client::AdminClient;
use tonic::transport::Channel;

/// Operate a dpuio agent: tenants, QoS, sessions, certificates, encryption keys.
#[derive(Parser)]
#[command(name = "dpuctl", version)]
struct Cli {
    /// The agent's admin socket [default: DATA_DIR/admin.sock].
    #[arg(long, env = "DPUCTL_SOCKET", global = true)]
    socket: Option<PathBuf>,
    /// The agent's data directory, to find its admin socket.
    #[arg(long, default_value = dpu_agent::config::DEFAULT_DATA_DIR, global = true)]
    data_dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Version, backend, uptime, sessions, tenants, and where each tenant's settings
    /// came from (the config file, or dpuctl and when).
    Status,
    /// Attached sessions.
    Sessions {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Tenants: list, add, rm, set-qos, set-limits (changes are kept in the agent's state
    /// file and applied at its next start; see docs/config.md).
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Client certificates from the agent's development CA.
    #[command(subcommand)]
    Cert(CertCommand),
    /// Inline-encryption keys of a tenant.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Stop accepting new sessions; existing ones run to completion.
    Drain,
    /// Install a dpuio-agent package on a DPU over SSH, start it and wait until it answers
    /// (a failed start puts the previous agent back). Needs `ssh` and `scp` here and `dpkg`
    /// on the target; does not use the admin socket.
    Deploy(DeployArgs),
}

#[derive(Args)]
struct DeployArgs {
    /// The DPU: [USER@]HOST[:PORT] (the SSH port; default 22).
    #[arg(long)]
    target: dpu_agent::deploy::Target,
    /// The package: target/packages/dpuio-agent_VERSION_ARCH.deb from `./x package`.
    #[arg(long)]
    package: PathBuf,
    /// The agent config, installed as /etc/dpuio/agent.toml (checked here and on the target).
    #[arg(long)]
    config: PathBuf,
    /// A directory of certificates and keys, installed as /etc/dpuio/certs (mode 0600).
    #[arg(long)]
    certs: Option<PathBuf>,
    /// SSH private key (ssh -i).
    #[arg(long)]
    identity: Option<PathBuf>,
    /// More ssh options, e.g. StrictHostKeyChecking=accept-new (repeatable; ssh -o).
    #[arg(long = "ssh-option", value_name = "OPTION")]
    ssh_options: Vec<String>,
    /// Unpack under DIR and run the agent in the background instead of `dpkg -i` and
    /// systemd (for machines without systemd, and for tests).
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Seconds the new agent has to answer after its start.
    #[arg(long, default_value_t = 60)]
    health_timeout_s: u64,
    /// Print every step and command; change nothing.
    #[arg(long)]
    dry_run: bool,
}

fn deploy(args: DeployArgs) -> ExitCode {
    let options = dpu_agent::deploy::Options {
        target: args.target,
        package: args.package,
        config: args.config,
        certs: args.certs,
        identity: args.identity,
        ssh_options: args.ssh_options,
        install: args.root.map_or(dpu_agent::deploy::Install::Systemd, dpu_agent::deploy::Install::Root),
        health_timeout: std::time::Duration::from_secs(args.health_timeout_s),
        dry_run: args.dry_run,
    };
    match dpu_agent::deploy::deploy(&options, &mut std::io::stdout()) {
        Ok(_) if options.dry_run => {
            println!("dry run: nothing was changed");
            ExitCode::SUCCESS
        }
        Ok(d) => {
            println!("dpu-agent {} ({}) is running and answers on {}", d.version, d.arch, options.target.host);
            println!("hosts attach with: DPUIO_AGENT={} dpuio ls /   (or --agent {0})", d.attach);
            if d.loopback_only {
                println!(
                    "note: the config listens on loopback only, so hosts cannot reach it: set [agent] listen to an address of the DPU"
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("dpuctl {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Subcommand)]
enum TenantCommand {
    /// List tenants with their container and QoS.
    List,
    /// Add a tenant and create its container.
    Add {
        name: String,
        /// Its container [default: the tenant's name].
        #[arg(long)]
        container: Option<String>,
        /// DAOS only: the tenant's DAOS calls run as this user of the agent's machine,
        /// in a worker process of its own (its containers admit that user only).
        #[arg(long)]
        daos_user: Option<String>,
        /// With --daos-user: the worker's group [default: the user's primary group].
        #[arg(long, requires = "daos_user")]
        daos_group: Option<String>,
        #[command(flatten)]
        limits: LimitArgs,
        #[command(flatten)]
        qos: QosArgs,
    },
    /// Remove a tenant: its sessions are detached at once; its data stays on disk. A
    /// tenant of the config file stays removed across restarts until `tenant add` brings it back.
    Rm { name: String },
    /// Change a tenant's QoS now (unset values become unlimited / default).
    SetQos {
        name: String,
        #[command(flatten)]
        qos: QosArgs,
    },
    /// Change a tenant's session limits now (unset: the agent-wide [limits]).
    SetLimits {
        name: String,
        #[command(flatten)]
        limits: LimitArgs,
    },
}

#[derive(Args)]
struct LimitArgs {
    /// Sessions of the tenant at once.
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    max_sessions: u32,
    /// Open handles per session.
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    max_handles_per_session: u32,
    /// Registered regions per session.
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    max_regions_per_session: u32,
}

#[derive(Args)]
struct QosArgs {
    /// Payload bytes per second, e.g. 500MiB (0: unlimited).
    #[arg(long, value_parser = parse_bytes, default_value = "0")]
    bytes_per_s: u64,
    /// Operations per second (0: unlimited).
    #[arg(long, default_value_t = 0)]
    ops_per_s: u64,
    /// Bytes admitted at once after idling [default: one second's worth].
    #[arg(long, value_parser = parse_bytes, default_value = "0")]
    burst_bytes: u64,
    /// Operations admitted at once after idling [default: one second's worth].
    #[arg(long, default_value_t = 0)]
    burst_ops: u64,
    /// Share of service when tenants compete [default: 1].
    #[arg(long, default_value_t = 0)]
    weight: u32,
    /// Data-plane requests in flight at once, over all the tenant's sessions [default: 1024].
    #[arg(long, default_value_t = 0)]
    max_inflight: u32,
}

impl QosArgs {
    fn to_proto(&self) -> pb::Qos {
        pb::Qos {
            bytes_per_s: self.bytes_per_s,
            ops_per_s: self.ops_per_s,
            burst_bytes: self.burst_bytes,
            burst_ops: self.burst_ops,
            weight: self.weight,
            max_inflight: self.max_inflight,
        }
    }
}

#[derive(Subcommand)]
enum CertCommand {
    /// Write ca.pem, client.pem and client.key for a tenant into a directory.
    Issue {
        #[arg(long)]
        tenant: String,
        /// Directory to write to (created, mode 0700; the key gets mode 0600).
        #[arg(long)]
        out: PathBuf,
        /// Validity in days.
        #[arg(long, default_value_t = 365)]
        days: u32,
    },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Add a new key version and re-wrap every file's data key under it (no data is
    /// re-encrypted; files stay readable throughout).
    Rotate {
        #[arg(long)]
        tenant: String,
        /// File with the new 256-bit key (32 bytes or 64 hex digits, mode 0600), as the agent sees it.
        #[arg(long)]
        new_key: PathBuf,
    },
    /// Key versions and how many files each wraps; a version wrapping none can be retired.
    Status {
        #[arg(long)]
        tenant: String,
    },
}

/// `4096`, `64KiB`, `500MiB`, `1GiB` (also K/M/G, KB/MB/GB as powers of 1000).
fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size such as 4096, 64KiB or 1GiB"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => return Err(format!("unknown unit {other:?}: use B, KiB, MiB or GiB")),
    };
    n.checked_mul(scale).ok_or_else(|| format!("{s:?} is too large"))
}

async fn connect(socket: &Path) -> Result<AdminClient<Channel>, String> {
    let path = socket.to_owned();
    let channel = tonic::transport::Endpoint::from_static("http://admin.sock")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { tokio::net::UnixStream::connect(path).await.map(hyper_util::rt::TokioIo::new) }
        }))
        .await
        .map_err(|e| {
            format!(
                "cannot reach the agent's admin socket {}: {} (is dpu-agent running with this data directory? \
                 pass --data-dir or --socket; only the agent's user and root may connect)",
                socket.display(),
                chain(&e)
            )
        })?;
    Ok(AdminClient::new(channel))
}

fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(&format!(": {part}"));
        }
        source = s.source();
    }
    text
}

fn status(op: &str) -> impl Fn(tonic::Status) -> String + '_ {
    move |s| format!("{op}: {}", s.message())
}

fn qos_line(q: Option<&pb::Qos>) -> String {
    let Some(q) = q else { return "unlimited".into() };
    let rate = |v: u64, unit: &str| if v == 0 { "unlimited".to_owned() } else { format!("{v} {unit}") };
    format!(
        "bytes {} (burst {}), ops {} (burst {}), weight {}, max in flight {}",
        rate(q.bytes_per_s, "B/s"),
        q.burst_bytes,
        rate(q.ops_per_s, "/s"),
        q.burst_ops,
        q.weight,
        q.max_inflight
    )
}

/// `config`, or `dpuctl 2026-11-25 10:00:00 UTC`.
fn origin(o: Option<&pb::Origin>) -> String {
    match o {
        Some(o) if o.source == "dpuctl" => format!("dpuctl {}", utc(o.changed_unix_s)),
        Some(o) => o.source.clone(),
        None => "-".to_owned(),
    }
}

/// Unix seconds as `YYYY-MM-DD HH:MM:SS UTC` (the proleptic Gregorian calendar).
fn utc(unix_s: i64) -> String {
    let (days, secs) = (unix_s.div_euclid(86_400), unix_s.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", secs / 3600, secs % 3600 / 60, secs % 60)
}

fn write_bundle(out: &Path, issued: &pb::IssueCertResponse) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let fail = |what: &Path, e: std::io::Error| format!("cannot write {}: {e}", what.display());
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(out).map_err(|e| fail(out, e))?;
    let files = [
        ("ca.pem", &issued.ca_pem, 0o644),
        ("client.pem", &issued.cert_pem, 0o644),
        ("client.key", &issued.key_pem, 0o600),
    ];
    for (name, text, mode) in files {
        let path = out.join(name);
        let _ = std::fs::remove_file(&path);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .map_err(|e| fail(&path, e))?;
        f.write_all(text.as_bytes()).map_err(|e| fail(&path, e))?;
    }
    Ok(())
}

async fn run(socket: &Path, command: Command) -> Result<(), String> {
    let mut admin = connect(socket).await?;
    match command {
        Command::Status => {
            let s = admin.status(pb::StatusRequest {}).await.map_err(status("status"))?.into_inner();
            println!("version   {}", s.version);
            println!("backend   {}", s.backend);
            println!("uptime    {} s", s.uptime_s);
            println!("sessions  {}", s.sessions);
            println!("tenants   {}", s.tenants);
            println!("draining  {}", s.draining);
            println!("metrics   {}", if s.metrics_listen.is_empty() { "off" } else { &s.metrics_listen });
            println!("state     {}", if s.state_file.is_empty() { "none" } else { &s.state_file });
            if !s.tenant_figures.is_empty() {
                println!();
                println!(
                    "{:<16}  {:>8}  {:>14}  {:>14}  {:>10}  {:>8}",
                    "tenant", "sessions", "read bytes", "written bytes", "ops", "errors"
                );
            }
            for t in &s.tenant_figures {
                println!(
                    "{:<16}  {:>8}  {:>14}  {:>14}  {:>10}  {:>8}",
                    t.tenant, t.sessions, t.read_bytes, t.written_bytes, t.operations, t.errors
                );
            }
            if !s.origins.is_empty() {
                println!();
                println!(
                    "where settings came from (config: the config file; dpuctl: changed with dpuctl, kept in the state file)"
                );
                println!("{:<16}  {:<28}  {:<28}  {:<28}  {:<28}", "tenant", "tenant", "qos", "limits", "key");
            }
            for o in &s.origins {
                if let Some(removed) = &o.removed {
                    println!("{:<16}  removed by {}", o.tenant, origin(Some(removed)));
                    continue;
                }
                let key = if o.key.is_some() { origin(o.key.as_ref()) } else { "-".to_owned() };
                println!(
                    "{:<16}  {:<28}  {:<28}  {:<28}  {:<28}",
                    o.tenant,
                    origin(o.entry.as_ref()),
                    origin(o.qos.as_ref()),
                    origin(o.limits.as_ref()),
                    key
                );
            }
        }
        Command::Sessions { tenant } => {
            let r = admin
                .list_sessions(pb::ListSessionsRequest { tenant: tenant.unwrap_or_default() })
                .await
                .map_err(status("sessions"))?
                .into_inner();
            println!(
                "{:<18}  {:<16}  {:>7}  {:>7}  {:>12}  client",
                "session", "tenant", "handles", "regions", "attached"
            );
            for s in r.sessions {
                println!(
                    "{:#018x}  {:<16}  {:>7}  {:>7}  {:>12}  {}",
                    s.session_id, s.tenant, s.open_handles, s.regions, s.attached_unix_s, s.client_name
                );
            }
        }
        Command::Tenant(TenantCommand::List) => {
            let r = admin.list_tenants(pb::ListTenantsRequest {}).await.map_err(status("tenant list"))?.into_inner();
            for t in r.tenants {
                let show = |n: u32| if n == 0 { "agent limit".to_owned() } else { n.to_string() };
                println!(
                    "{}  container {}  encrypted {}  max sessions {}  handles/session {}  regions/session {}  qos: {}",
                    t.name,
                    t.container,
                    t.encrypted,
                    show(t.max_sessions),
                    show(t.max_handles_per_session),
                    show(t.max_regions_per_session),
                    qos_line(t.qos.as_ref())
                );
                if !t.daos_user.is_empty() {
                    let group = if t.daos_group.is_empty() { "its primary group" } else { t.daos_group.as_str() };
                    println!("  DAOS identity: user {} group {group} (a worker process of its own)", t.daos_user);
                }
            }
        }
        Command::Tenant(TenantCommand::Add { name, container, daos_user, daos_group, limits, qos }) => {
            let tenant = pb::Tenant {
                name: name.clone(),
                container: container.unwrap_or_default(),
                qos: Some(qos.to_proto()),
                max_sessions: limits.max_sessions,
                encrypted: false,
                max_handles_per_session: limits.max_handles_per_session,
                max_regions_per_session: limits.max_regions_per_session,
                daos_user: daos_user.unwrap_or_default(),
                daos_group: daos_group.unwrap_or_default(),
            };
            admin.add_tenant(pb::AddTenantRequest { tenant: Some(tenant) }).await.map_err(status("tenant add"))?;
            println!("added tenant {name} (kept in the agent's state file across restarts)");
        }
        Command::Tenant(TenantCommand::Rm { name }) => {
            let r = admin
                .remove_tenant(pb::RemoveTenantRequest { name: name.clone() })
                .await
                .map_err(status("tenant rm"))?
                .into_inner();
            println!("removed tenant {name}: {} session(s) detached; its data stays on disk", r.detached_sessions);
        }
        Command::Tenant(TenantCommand::SetQos { name, qos }) => {
            admin
                .set_qos(pb::SetQosRequest { tenant: name.clone(), qos: Some(qos.to_proto()) })
                .await
                .map_err(status("tenant set-qos"))?;
            println!("tenant {name}: {}", qos_line(Some(&qos.to_proto())));
        }
        Command::Tenant(TenantCommand::SetLimits { name, limits }) => {
            admin
                .set_limits(pb::SetLimitsRequest {
                    tenant: name.clone(),
                    max_sessions: limits.max_sessions,
                    max_handles_per_session: limits.max_handles_per_session,
                    max_regions_per_session: limits.max_regions_per_session,
                })
                .await
                .map_err(status("tenant set-limits"))?;
            let show = |n: u32| if n == 0 { "agent limit".to_owned() } else { n.to_string() };
            println!(
                "tenant {name}: sessions {}, handles per session {}, regions per session {}",
                show(limits.max_sessions),
                show(limits.max_handles_per_session),
                show(limits.max_regions_per_session)
            );
        }
        Command::Cert(CertCommand::Issue { tenant, out, days }) => {
            let issued = admin
                .issue_cert(pb::IssueCertRequest { tenant, validity_days: days })
                .await
                .map_err(status("cert issue"))?
                .into_inner();
            write_bundle(&out, &issued)?;
            println!("wrote ca.pem, client.pem, client.key to {} for {}", out.display(), issued.spiffe_id);
            println!("use: dpuio --cert {0}/client.pem --key {0}/client.key --ca {0}/ca.pem ...", out.display());
        }
        Command::Key(KeyCommand::Rotate { tenant, new_key }) => {
            let file = std::path::absolute(&new_key).unwrap_or(new_key);
            let r = admin
                .rotate_key(pb::RotateKeyRequest { tenant: tenant.clone(), new_key_file: file.display().to_string() })
                .await
                .map_err(status("key rotate"))?
                .into_inner();
            println!(
                "tenant {tenant}: key version {} -> {}: {} re-wrapped, {} already new, {} on other versions, {} unencrypted, {} failed",
                r.old_version, r.new_version, r.rewrapped, r.already_new, r.other_version, r.unencrypted, r.failed
            );
            for f in &r.failures {
                println!("  failed: {f}");
            }
            if r.failed > 0 {
                return Err(format!("{} file(s) still use key version {}: keep that key", r.failed, r.old_version));
            }
        }
        Command::Key(KeyCommand::Status { tenant }) => {
            let r = admin
                .key_status(pb::KeyStatusRequest { tenant: tenant.clone() })
                .await
                .map_err(status("key status"))?
                .into_inner();
            println!("tenant {tenant}: current key version {}", r.current_version);
            for v in r.versions {
                let note = if v.current {
                    "current"
                } else if v.can_retire {
                    "can be retired"
                } else {
                    "in use"
                };
                println!("  version {}: {} file(s), {note}", v.version, v.files);
            }
            println!("  unencrypted files: {}, unreadable: {}", r.unencrypted, r.unreadable);
            for f in r.unreadable_files {
                println!("  unreadable: {f}");
            }
        }
        Command::Deploy(_) => return Err("deploy does not use the admin socket".into()),
        Command::Drain => {
            admin.drain(pb::DrainRequest {}).await.map_err(status("drain"))?;
            println!("draining: the agent takes no new sessions");
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = match cli.command {
        Command::Deploy(args) => return deploy(args),
        other => other,
    };
    let socket = cli.socket.unwrap_or_else(|| cli.data_dir.join("admin.sock"));
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("dpuctl: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&socket, command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dpuctl: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_bytes, utc};

    #[test]
    fn times_read_as_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_000_000), "2026-11-18 11:06:40 UTC");
        assert_eq!(utc(-1), "1969-12-31 23:59:59 UTC");
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64KiB"), Ok(64 << 10));
        assert_eq!(parse_bytes("500MiB"), Ok(500 << 20));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("5 parsecs").is_err());
        assert!(parse_bytes("99999999999999GiB").is_err());
    }
}
