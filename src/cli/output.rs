//! Standard output that ends quietly when the reader goes away.
//!
//! `println!` panics on a closed pipe (`idgen decode ID | head -1`). Every
//! command writes through [`outln!`] instead, and `main` turns the broken
//! pipe into a quiet exit 0, as other Unix tools do. IDs of a long `idgen
//! gen` go out through an [`IdStream`], batch by batch, and an
//! [`Interrupt`] turns Ctrl-C into an orderly end that says how many were
//! printed.

use std::fmt::Display;
use std::io::{BufWriter, Stdout, Write};

/// Writes `text` to standard output and flushes it.
pub fn write(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Whether `error` (anywhere in its chain) is a write to a closed pipe.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `println!` that returns an error instead of panicking on a closed pipe.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::output::write(&format!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use outln;

/// IDs written to standard output as each batch arrives, one per line or
/// as one JSON object (`{"ids":["...",...]}`), flushed after every batch.
///
/// Every ID a node handed out is issued for good: a command that gathered
/// them all before printing lost every one to a Ctrl-C or a failed call.
/// Streaming keeps what was taken, and the count of what was printed is
/// what the error tells the user.
pub struct IdStream<W: Write = Stdout> {
    out: BufWriter<W>,
    json: bool,
    printed: u64,
}

impl IdStream {
    /// A stream to standard output; nothing is written yet.
    pub fn new(json: bool) -> Self {
        Self::to(std::io::stdout(), json)
    }
}

impl<W: Write> IdStream<W> {
    /// A stream to `out` (a test's buffer).
    pub fn to(out: W, json: bool) -> Self {
        Self {
            out: BufWriter::with_capacity(64 * 1024, out),
            json,
            printed: 0,
        }
    }

    /// How many IDs were written and flushed.
    pub fn printed(&self) -> u64 {
        self.printed
    }

    /// Writes `ids` and flushes them, so a reader (and an interruption)
    /// sees whole lines only.
    pub fn batch<T: Display>(&mut self, ids: &[T]) -> std::io::Result<()> {
        for id in ids {
            if self.json {
                let sep = if self.printed == 0 { "{\"ids\":[" } else { "," };
                let quoted =
                    serde_json::to_string(&id.to_string()).map_err(std::io::Error::from)?;
                write!(self.out, "{sep}{quoted}")?;
            } else {
                writeln!(self.out, "{id}")?;
            }
            self.printed += 1;
        }
        self.out.flush()
    }

    /// Ends the output: JSON gets its closing brackets (also after a
    /// failure, so what was printed stays one valid object).
    pub fn finish(self) -> std::io::Result<W> {
        let mut out = self.out;
        if self.json {
            let open = if self.printed == 0 { "{\"ids\":[" } else { "" };
            writeln!(out, "{open}]}}")?;
        }
        out.into_inner().map_err(|e| e.into_error())
    }
}

/// The command was stopped by SIGINT (Ctrl-C); `main` exits with status
/// 130, as a shell reports a process ended by SIGINT.
#[derive(Debug, thiserror::Error)]
#[error("interrupted (SIGINT)")]
pub struct Interrupted;

/// SIGINT taken over for the length of a command that must say what it
/// did before it ends (a signal's default action would end the process
/// with the last batch unreported).
pub struct Interrupt {
    #[cfg(unix)]
    signal: tokio::signal::unix::Signal,
}

impl Interrupt {
    /// Takes over SIGINT now: from here a Ctrl-C no longer ends the
    /// process but completes [`Interrupt::recv`].
    pub fn new() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            let signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
            Ok(Self { signal })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// Completes when SIGINT arrives.
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        {
            self.signal.recv().await;
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The innermost cause of an error, which is the only part that says what
/// happened ("Connection refused"); the outer layers repeat each other.
pub fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}
