//! `consul-testserver`: the in-memory Consul server as a process, for
//! clients outside Rust (see `scripts/consul-interop.sh`).
//!
//! ```text
//! consul-testserver [--listen 127.0.0.1:8500] [--acl-token <master token>]
//!                   [--session-ttl-min 10s] [--check-reap-interval 30s]
//!                   [--https-cert FILE --https-key FILE [--https-client-ca FILE]]
//!                   [--check-ca FILE [--check-cert FILE --check-key FILE]]
//!                   [--raft-write-ms 2] [--consistent-read-ms 0.5]
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
use std::time::Duration;

use consul_testserver::{Config, TestConsul};

const USAGE: &str = concat!(
    "usage: consul-testserver [--listen ADDR] [--acl-token TOKEN]\n",
    "                         [--session-ttl-min DURATION] [--check-reap-interval DURATION]\n",
    "  --listen ADDR                   address to serve on (default 127.0.0.1:8500; port 0 picks one)\n",
    "  --acl-token TOKEN               enable ACLs with TOKEN as the master token\n",
    "  --session-ttl-min DURATION      shortest session TTL: Consul's session_ttl_min (default 10s)\n",
    "  --check-reap-interval DURATION  how often critical services are reaped: Consul's\n",
    "                                  check_reap_interval (default 30s)\n",
    "  --https-cert FILE, --https-key FILE  serve HTTPS with this PEM certificate and key\n",
    "  --https-client-ca FILE          require client certificates from this CA (verify_incoming)\n",
    "  --check-ca FILE                 CA that gRPC checks with GRPCUseTLS trust\n",
    "  --check-cert FILE, --check-key FILE  client certificate those checks present\n",
    "  --raft-write-ms MS              a Raft write commits after MS ms (concurrent writes share\n",
    "                                  a commit round; default 0)\n",
    "  --consistent-read-ms MS         a ?consistent read waits MS ms (default 0)\n",
    "  --datacenter NAME               name of the first datacenter (default dc1)\n",
    "  --primary-datacenter NAME       primary_datacenter every agent reports (default: the first)\n",
    "  --add-datacenter NAME=ADDR      another datacenter in this process, linked with the first\n",
    "                                  (?dc=NAME reaches it), its agent listening on ADDR (repeatable)",
);

#[derive(Debug)]
struct Args {
    listen: SocketAddr,
    config: Config,
    /// Further datacenters: name and listen address of their first agent.
    more: Vec<(String, SocketAddr)>,
}

/// The datacenter flags; false if `arg` is not one of them.
fn datacenter_flag(
    arg: &str,
    args: &mut impl Iterator<Item = String>,
    config: &mut Config,
    more_datacenters: &mut Vec<(String, SocketAddr)>,
) -> Result<bool, String> {
    match arg {
        "--datacenter" => {
            config.datacenter = args.next().ok_or("--datacenter needs a name")?;
        }
        "--primary-datacenter" => {
            config.primary_datacenter =
                Some(args.next().ok_or("--primary-datacenter needs a name")?);
        }
        "--add-datacenter" => {
            let value = args.next().ok_or("--add-datacenter needs NAME=ADDR")?;
            let (name, addr) = value
                .split_once('=')
                .filter(|(name, _)| !name.is_empty())
                .ok_or_else(|| format!("--add-datacenter {value:?}: not NAME=ADDR"))?;
            let addr = addr
                .parse()
                .map_err(|e| format!("--add-datacenter {value:?}: {e}"))?;
            more_datacenters.push((name.to_owned(), addr));
        }
        _ => return Ok(false),
    }
    Ok(true)
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut listen = SocketAddr::from(([127, 0, 0, 1], 8500));
    let mut config = Config::default();
    let duration = |flag: &str, value: Option<String>| -> Result<Duration, String> {
        let value = value.ok_or_else(|| format!("{flag} needs a duration such as 10s"))?;
        consul_testserver::parse_go_duration(&value)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("{flag} {value:?}: not a positive duration such as 10s"))
    };
    let millis = |flag: &str, value: Option<String>| -> Result<Duration, String> {
        let value = value.ok_or_else(|| format!("{flag} needs milliseconds such as 2 or 0.5"))?;
        value
            .parse::<f64>()
            .ok()
            .filter(|ms| ms.is_finite() && (0.0..=10_000.0).contains(ms))
            .map(|ms| Duration::from_secs_f64(ms / 1000.0))
            .ok_or_else(|| format!("{flag} {value:?}: not milliseconds from 0 to 10000"))
    };
    let file = |flag: &str, value: Option<String>| -> Result<Vec<u8>, String> {
        let path = value.ok_or_else(|| format!("{flag} needs a file"))?;
        std::fs::read(&path).map_err(|e| format!("{flag} {path}: {e}"))
    };
    let (mut cert, mut key, mut check_cert, mut check_key) = (None, None, None, None);
    let mut client_ca = None;
    let mut more = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--https-cert" => cert = Some(file(&arg, args.next())?),
            "--https-key" => key = Some(file(&arg, args.next())?),
            "--https-client-ca" => client_ca = Some(file(&arg, args.next())?),
            "--check-ca" => config.check_tls.ca_pem = Some(file(&arg, args.next())?),
            "--check-cert" => check_cert = Some(file(&arg, args.next())?),
            "--check-key" => check_key = Some(file(&arg, args.next())?),
            "--listen" => {
                let value = args.next().ok_or("--listen needs an address")?;
                listen = value
                    .parse()
                    .map_err(|e| format!("--listen {value:?}: {e}"))?;
            }
            "--acl-token" => {
                config.acl_master_token = Some(args.next().ok_or("--acl-token needs a token")?);
            }
            "--session-ttl-min" => config.min_ttl = duration(&arg, args.next())?,
            "--check-reap-interval" => {
                config.check_reap_interval = duration(&arg, args.next())?;
            }
            "--raft-write-ms" => config.raft_write_delay = millis(&arg, args.next())?,
            "--consistent-read-ms" => {
                config.consistent_read_delay = millis(&arg, args.next())?;
            }
            "-h" | "--help" => return Err(String::new()),
            _ if datacenter_flag(&arg, &mut args, &mut config, &mut more)? => {}
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    match (cert, key) {
        (Some(cert_pem), Some(key_pem)) => {
            config.https = Some(consul_testserver::HttpsConfig {
                cert_pem,
                key_pem,
                client_ca_pem: client_ca,
            })
        }
        (None, None) if client_ca.is_none() => {}
        _ => {
            return Err(
                "--https-cert and --https-key go together (and --https-client-ca needs them)"
                    .into(),
            )
        }
    }
    match (check_cert, check_key) {
        (Some(c), Some(k)) => config.check_tls.client_pem = Some((c, k)),
        (None, None) => {}
        _ => return Err("--check-cert and --check-key go together".into()),
    }
    Ok(Args {
        listen,
        config,
        more,
    })
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
    let args = match parse_args(std::env::args().skip(1)) {
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
    let consul = match TestConsul::serve(args.config, listener).await {
        Ok(consul) => consul,
        Err(e) => {
            eprintln!("consul-testserver: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("listening on {}", consul.addr());
    let mut linked = Vec::new();
    for (name, addr) in &args.more {
        let started = match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => consul.serve_linked_datacenter(name, listener).await,
            Err(e) => Err(e),
        };
        match started {
            Ok(dc) => {
                println!("datacenter {name} listening on {}", dc.addr());
                linked.push(dc);
            }
            Err(e) => {
                eprintln!("consul-testserver: datacenter {name} on {addr}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    // The parent reads this line through a pipe: flush it now.
    if let Err(e) = std::io::stdout().flush() {
        eprintln!("consul-testserver: stdout: {e}");
        return ExitCode::FAILURE;
    }
    let result = wait_for_signal().await;
    for dc in linked {
        dc.shutdown().await;
    }
    consul.shutdown().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("consul-testserver: signal handling failed: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        parse_args(args.iter().map(|a| a.to_string()))
    }

    #[test]
    fn defaults_are_consuls_and_flags_lower_them() {
        let args = parse(&[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(args.config.min_ttl, Duration::from_secs(10));
        assert_eq!(args.config.check_reap_interval, Duration::from_secs(30));
        assert_eq!(args.config.acl_master_token, None);
        let args = parse(&[
            "--session-ttl-min",
            "1s",
            "--check-reap-interval",
            "500ms",
            "--acl-token",
            "t",
            "--raft-write-ms",
            "2",
            "--consistent-read-ms",
            "0.5",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(args.config.min_ttl, Duration::from_secs(1));
        assert_eq!(args.config.check_reap_interval, Duration::from_millis(500));
        assert_eq!(args.config.acl_master_token.as_deref(), Some("t"));
        assert_eq!(args.config.raft_write_delay, Duration::from_millis(2));
        assert_eq!(
            args.config.consistent_read_delay,
            Duration::from_micros(500)
        );
        for bad in [
            &["--session-ttl-min"][..],
            &["--session-ttl-min", "soon"],
            &["--check-reap-interval", "0s"],
            &["--nope"],
            &["--raft-write-ms", "-1"],
            &["--consistent-read-ms", "fast"],
            &["--add-datacenter", "dc2"],
            &["--add-datacenter", "=127.0.0.1:0"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
