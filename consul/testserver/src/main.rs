//! `consul-testserver`: the in-memory Consul server as a process, for
//! clients outside Rust (see `scripts/consul-interop.sh`).
//!
//! ```text
//! consul-testserver [--listen 127.0.0.1:8500] [--acl-token <master token>]
//! ```
//!
//! Prints `listening on <addr>` as its first line, then serves until
//! SIGINT or SIGTERM. Consul's defaults apply (session TTL at least 10 s,
//! reaper every 30 s). `PUT /_testserver/leader-election` (with the master
//! token when ACLs are on) makes the cluster elect a new leader: every
//! session timer restarts at 2 x TTL and lock-delays are forgotten.

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;

use consul_testserver::{Config, TestConsul};

const USAGE: &str = "usage: consul-testserver [--listen ADDR] [--acl-token TOKEN]\n\
  --listen ADDR       address to serve on (default 127.0.0.1:8500; port 0 picks one)\n\
  --acl-token TOKEN   enable ACLs with TOKEN as the master token";

struct Args {
    listen: SocketAddr,
    acl_token: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut listen = SocketAddr::from(([127, 0, 0, 1], 8500));
    let mut acl_token = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => {
                let value = args.next().ok_or("--listen needs an address")?;
                listen = value
                    .parse()
                    .map_err(|e| format!("--listen {value:?}: {e}"))?;
            }
            "--acl-token" => {
                acl_token = Some(args.next().ok_or("--acl-token needs a token")?);
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Args { listen, acl_token })
}

async fn wait_for_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result,
        _ = term.recv() => Ok(()),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            if message.is_empty() {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            eprintln!("consul-testserver: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("consul-testserver: cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let config = Config {
        acl_master_token: args.acl_token,
        ..Config::default()
    };
    let consul = match TestConsul::serve(config, listener).await {
        Ok(consul) => consul,
        Err(e) => {
            eprintln!("consul-testserver: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("listening on {}", consul.addr());
    // The parent reads this line through a pipe: flush it now.
    if let Err(e) = std::io::stdout().flush() {
        eprintln!("consul-testserver: stdout: {e}");
        return ExitCode::FAILURE;
    }
    let result = wait_for_signal().await;
    consul.shutdown().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("consul-testserver: signal handling failed: {e}");
            ExitCode::FAILURE
        }
    }
}
