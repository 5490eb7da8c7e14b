//! Standard output that ends quietly when the reader goes away.
//!
//! `println!` panics on a closed pipe (`idgen decode ID | head -1`). Every
//! command writes through [`outln!`] instead, and `main` turns the broken
//! pipe into a quiet exit 0, as other Unix tools do.

use std::io::Write;

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
