//! The `dpu-agent` daemon.
#![forbid(unsafe_code)]

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use dpu_agent::config::{BackendConfig, Config, ConfigError};

/// The dpuio agent: serves the dpuio.v1 control plane and runs the storage backend.
#[derive(Parser)]
#[command(name = "dpu-agent", version, about)]
struct Cli {
    /// Log format on stderr (level from RUST_LOG, default info).
    #[arg(long, value_enum, default_value = "text", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent. With no config: embedded backend under ./dpuio-data, tenant and
    /// container "default", listening on 127.0.0.1:7300.
    Serve {
        /// TOML config file (see docs/config.md).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Control-plane address, overriding the config (loopback only with `[tls] mode = "off"`;
        /// port 0 picks a free port, printed on stdout).
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Also serve grpc.health.v1 alone, in plaintext, here (kubelet's `grpc` probe speaks
        /// no TLS), overriding the config's `[agent] health_listen`.
        #[arg(long, value_name = "ADDR")]
        health_listen: Option<SocketAddr>,
        /// Data directory (the local backend's containers live under it), overriding the config.
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// A tenant's DAOS worker (started by the agent itself for a tenant with `daos_user`).
    #[command(hide = true)]
    TenantWorker {
        /// The tenant it serves (for its log lines).
        #[arg(long)]
        tenant: String,
    },
    /// Check a config file and explain every mistake; exits 1 if there is any.
    CheckConfig {
        /// The TOML file to check.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::TenantWorker { tenant } => {
            match dpuio_worker::spawn::inherited_control().map_err(|e| e.to_string()).and_then(dpuio_worker::serve::run)
            {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("dpu-agent tenant-worker (tenant {tenant}): {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::CheckConfig { file } => match Config::load(&file) {
            Ok(config) => {
                println!(
                    "{}: ok (listen {}, {}, {} tenant(s))",
                    file.display(),
                    config.listen,
                    describe_backend(&config),
                    config.tenants.len()
                );
                if let BackendConfig::Daos(daos) = &config.backend {
                    for note in daos_notes(daos) {
                        println!("  note: {note}");
                    }
                    for note in identity_notes(daos, &config.tenants) {
                        println!("  note: {note}");
                    }
                }
                // Said, not judged, like the DAOS notes: the agent's machine may differ.
                if let Some(name) = &config.data_plane.interface
                    && let Err(e) = fabric::config::check_interface(name)
                {
                    println!("  note: [data_plane] interface on this machine: {e}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Serve { config, listen, health_listen, data_dir } => {
            let config = match resolve(config, listen, health_listen, data_dir) {
                Ok(c) => c,
                Err(message) => {
                    eprintln!("dpu-agent: {message}");
                    return ExitCode::from(2);
                }
            };
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("dpu-agent: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let result = runtime.block_on(dpu_agent::server::serve(config, |listening| {
                // Tests and scripts read this line to find a port picked with :0: the
                // address, then "(mtls)" or "(plaintext)", then "metrics ADDR" when
                // [metrics] listen is set.
                let mode = if listening.mtls { "mtls" } else { "plaintext" };
                let metrics = listening.metrics.map(|m| format!(" metrics {m}")).unwrap_or_default();
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "dpu-agent listening on {} ({mode}){metrics}", listening.addr);
                let _ = out.flush();
            }));
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e @ dpu_agent::serve_error::ServeError::DaosUnanswered { .. }) => {
                    eprintln!("dpu-agent: {e}");
                    // Not through main's return: its teardown would run under the calls
                    // still inside DAOS.
                    dpuio_daos::exit_leaving_calls_in_daos(dpu_agent::server::EXIT_DRAIN_TIMEOUT)
                }
                Err(e) => {
                    eprintln!("dpu-agent: {e}");
                    if !dpuio_daos::stuck_calls().is_empty() {
                        // A failure while DAOS still owes answers (a final sync it left
                        // unanswered): the teardown would run under those calls (seen:
                        // SIGSEGV in the DAOS client after this message).
                        dpuio_daos::exit_leaving_calls_in_daos(1)
                    }
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn describe_backend(config: &Config) -> String {
    match &config.backend {
        BackendConfig::Local { path } => format!("backend local at {}", path.display()),
        BackendConfig::Daos(d) => format!("backend daos: pool {:?} of system {:?}", d.pool, d.system),
    }
}

/// What `serve` would meet on this machine (libraries, daos_agent): said, not judged,
/// since a config is often checked on another machine than the one that runs it.
fn daos_notes(daos: &dpu_agent::config::DaosConfig) -> Vec<String> {
    let options = dpu_agent::server::daos_options(daos);
    let mut notes = Vec::new();
    match dpuio_daos::load_libraries() {
        Ok(()) => notes.push("the DAOS client libraries load on this machine".to_owned()),
        Err(e) => notes.push(format!("on this machine: {e}")),
    }
    let socket = options.agent_socket_dir.join("daos_agent.sock");
    if socket.exists() {
        notes.push(format!("a daos_agent socket is at {}", socket.display()));
    } else {
        notes.push(format!(
            "no daos_agent socket at {} on this machine: serve needs daos_agent running there",
            socket.display()
        ));
    }
    notes
}

/// For each tenant with a DAOS identity whose container exists: whether its ACL admits
/// other principals than that identity, read by a worker as the tenant's user.
fn identity_notes(daos: &dpu_agent::config::DaosConfig, tenants: &[dpu_agent::config::TenantConfig]) -> Vec<String> {
    let Ok(exe) = std::env::current_exe() else { return vec!["cannot find dpu-agent's own executable".into()] };
    let mut notes = Vec::new();
    for tenant in tenants.iter().filter(|t| !t.daos_user.is_empty()) {
        let Ok(identity) = dpuio_worker::Identity::resolve(&tenant.daos_user, &tenant.daos_group) else { continue };
        let worker = dpuio_worker::WorkerBackend::new(
            &tenant.name,
            identity.clone(),
            daos.worker_setup(&tenant.name),
            exe.clone(),
        );
        let note = match worker.acl(&tenant.container) {
            Ok((owner, entries)) => match dpuio_worker::foreign_principals(&identity, &owner, &entries) {
                foreign if foreign.is_empty() => {
                    format!(
                        "tenant {:?}: container {:?} admits its DAOS user {} only",
                        tenant.name, tenant.container, identity.user
                    )
                }
                foreign => format!(
                    "tenant {:?}: container {:?} admits other principals than its DAOS user {}: {} (remove them with \
                     `daos container delete-acl {} {} --principal=...`)",
                    tenant.name,
                    tenant.container,
                    identity.user,
                    foreign.join(", "),
                    daos.pool,
                    tenant.container
                ),
            },
            Err(e) => format!(
                "tenant {:?}: cannot read the ACL of container {:?} as {}: {e}",
                tenant.name, tenant.container, identity.user
            ),
        };
        notes.push(note);
    }
    notes
}

/// The config file (or the defaults) with the command-line flags applied on top.
fn resolve(
    file: Option<PathBuf>,
    listen: Option<SocketAddr>,
    health_listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
) -> Result<Config, String> {
    let mut config = match file {
        Some(path) => Config::load(&path).map_err(|e: ConfigError| e.to_string())?,
        None => Config::default(),
    };
    if let Some(addr) = listen {
        if !config.tls.mtls && !addr.ip().is_loopback() {
            return Err(format!(
                "--listen {addr}: not a loopback address, and the config turns TLS off ([tls] mode = \"off\"): \
                 plaintext is served on 127.0.0.1 or [::1] only; use mode = \"mtls\" to listen beyond this machine"
            ));
        }
        config.listen = addr;
    }
    if let Some(addr) = health_listen {
        config.health_listen = Some(addr);
    }
    if let Some(health) = config.health_listen
        && health == config.listen
        && health.port() != 0
    {
        return Err(format!("the health address {health} is the control-plane address: use another port"));
    }
    if let Some(dir) = data_dir {
        // --data-dir moves the local backend's tree; a DAOS backend keeps its pool.
        if let BackendConfig::Local { .. } = config.backend {
            config.backend = BackendConfig::Local { path: dir.clone() };
        }
        config.data_dir = dir;
    }
    Ok(config)
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
