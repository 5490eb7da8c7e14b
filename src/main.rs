//! The `idgen` command: parse the command line, build the runtime, run
//! the subcommand (each lives in `cli/`), and turn its result into an
//! exit code.

use std::process::ExitCode;

use clap::Parser;

mod cli;

use cli::args::{Cli, Command, StateCommand, TlsCommand};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`idgen decode ID | head -1`): done.
        Err(e) if cli::output::is_broken_pipe(&e) => ExitCode::SUCCESS,
        // Ctrl-C: what was done is said, and the status is a shell's for
        // a process SIGINT ended.
        Err(e) if e.chain().any(|c| c.is::<cli::output::Interrupted>()) => {
            eprintln!("{e:#}");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one subcommand.
async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(a) => cli::serve::run(a).await,
        Command::Init(a) => cli::init::run(a),
        Command::Gen(a) => cli::gen::run(a).await,
        Command::Decode(a) => cli::decode::run(a).await,
        Command::Bench(a) => cli::bench::run(a).await,
        Command::Admin(a) => cli::admin::run(a).await,
        Command::CheckConfig(a) => cli::check::run(a),
        Command::State(StateCommand::Backup(a)) => cli::state::backup(a).await,
        Command::State(StateCommand::Restore(a)) => cli::state::restore(a),
        Command::Format(c) => cli::gen::format_command(c).await,
        Command::Tls(TlsCommand::DevCerts(a)) => cli::tls::dev_certs(&a),
    }
}
