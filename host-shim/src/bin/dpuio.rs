//! `dpuio`: the host command line for a dpuio agent.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dpuio_shim::{Attr, Client, ConnectOptions, DEFAULT_AGENT, EntryKind};

/// Work with the files of your tenant's container through the dpuio agent.
#[derive(Parser)]
#[command(name = "dpuio", version, about)]
struct Cli {
    /// Agent address (host:port or http://host:port).
    #[arg(long, env = "DPUIO_AGENT", default_value = DEFAULT_AGENT, global = true)]
    agent: String,
    /// Tenant to attach as (agents without client authentication only; default: the agent's default tenant).
    #[arg(long, env = "DPUIO_TENANT", default_value = "", hide_default_value = true, global = true)]
    tenant: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List a directory (name order).
    Ls {
        /// Long format: kind, size, modification time, name.
        #[arg(short, long)]
        long: bool,
        #[arg(default_value = "/")]
        path: String,
    },
    /// Show the attributes of paths.
    Stat {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Create directories.
    Mkdir {
        /// Create missing parents; no error if the directory exists.
        #[arg(short, long)]
        parents: bool,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Remove files or directories.
    Rm {
        /// Remove directories and everything under them.
        #[arg(short, long)]
        recursive: bool,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Rename a file or directory (fails if the destination exists).
    Mv { from: String, to: String },
    /// Create empty files, or leave existing ones as they are.
    Touch {
        #[arg(required = true)]
        paths: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("dpuio: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dpuio: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> dpuio_shim::Result<()> {
    let client = Client::connect(ConnectOptions {
        agent: cli.agent,
        tenant: cli.tenant,
        client_name: "dpuio cli".into(),
        ..ConnectOptions::default()
    })
    .await?;
    let result = command(&client, cli.command).await;
    // Detach even after a failed command, so the agent frees the session at once.
    let detached = client.detach().await;
    result.and(detached)
}

async fn command(client: &Client, command: Command) -> dpuio_shim::Result<()> {
    match command {
        Command::Ls { long, path } => {
            client
                .readdir_batches(&path, None, 0, |batch| {
                    for e in batch {
                        if long {
                            println!("{}", long_line(&e.attr, &e.name));
                        } else {
                            println!("{}", e.name);
                        }
                    }
                    Ok(())
                })
                .await?;
        }
        Command::Stat { paths } => {
            for path in paths {
                let a = client.stat(&path).await?;
                println!("{}", long_line(&a, &path));
            }
        }
        Command::Mkdir { parents, paths } => {
            for path in paths {
                client.mkdir(&path, parents).await?;
            }
        }
        Command::Rm { recursive, paths } => {
            for path in paths {
                client.remove(&path, recursive).await?;
            }
        }
        Command::Mv { from, to } => client.rename(&from, &to).await?,
        Command::Touch { paths } => {
            for path in paths {
                match client.create(&path, true).await {
                    Ok(file) => file.close().await?,
                    Err(e) if e.code() == Some(tonic::Code::AlreadyExists) => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(())
}

fn long_line(a: &Attr, name: &str) -> String {
    let kind = match a.kind {
        EntryKind::Directory => 'd',
        EntryKind::File => '-',
    };
    let secs = a.mtime_ns.div_euclid(1_000_000_000);
    format!("{kind}{:04o} {:>14} {:>12} {name}", a.mode & 0o7777, a.size, secs)
}
