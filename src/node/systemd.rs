//! systemd's service notification protocol (`sd_notify`), for
//! `Type=notify` units: `READY=1` once the node serves, `STOPPING=1` when
//! it begins to shut down, and `WATCHDOG=1` every half `WATCHDOG_USEC`
//! while the runtime is alive.
//!
//! The protocol is one datagram per message on the unix socket named by
//! `NOTIFY_SOCKET` (a path, or `@name` for an abstract socket), so it needs
//! no crate. Without `NOTIFY_SOCKET` (not started by systemd) every call
//! does nothing. A failed send is logged once and never stops the node:
//! readiness reporting must not take down a node that issues IDs.

use std::ffi::OsString;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Where to send notifications.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifyTarget {
    /// A socket file.
    Path(PathBuf),
    /// A Linux abstract socket (`@name` in `NOTIFY_SOCKET`), name without
    /// the `@`.
    Abstract(Vec<u8>),
}

/// Sends service notifications to systemd, or nothing when not under it.
#[derive(Debug, Clone)]
pub struct Notifier {
    target: Option<NotifyTarget>,
    watchdog: Option<Duration>,
    warned: Arc<AtomicBool>,
}

impl Notifier {
    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` from the
    /// environment.
    pub fn from_env() -> Self {
        Self::from_vars(
            std::env::var_os("NOTIFY_SOCKET"),
            std::env::var_os("WATCHDOG_USEC"),
            std::env::var_os("WATCHDOG_PID"),
            std::process::id(),
        )
    }

    /// Like [`Notifier::from_env`] with the variables given. The watchdog
    /// is on when `WATCHDOG_USEC` is a positive number and `WATCHDOG_PID`
    /// is unset or names `pid` (systemd sets it to the main process; a
    /// child that inherited the variables must not ping for its parent).
    pub fn from_vars(
        notify_socket: Option<OsString>,
        watchdog_usec: Option<OsString>,
        watchdog_pid: Option<OsString>,
        pid: u32,
    ) -> Self {
        let target = notify_socket.and_then(|s| {
            use std::os::unix::ffi::OsStrExt;
            let bytes = s.as_bytes();
            match bytes.first() {
                None => None,
                Some(b'@') => Some(NotifyTarget::Abstract(bytes[1..].to_vec())),
                Some(_) => Some(NotifyTarget::Path(PathBuf::from(s))),
            }
        });
        let for_us = watchdog_pid
            .map(|p| p.to_str().and_then(|p| p.parse::<u32>().ok()) == Some(pid))
            .unwrap_or(true);
        let watchdog = watchdog_usec
            .and_then(|u| u.to_str().and_then(|u| u.parse::<u64>().ok()))
            .filter(|&u| u > 0 && for_us && target.is_some())
            .map(Duration::from_micros);
        Self {
            target,
            watchdog,
            warned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// True when started by systemd with a notification socket.
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// How often to send `WATCHDOG=1`: half of `WATCHDOG_USEC`, as
    /// systemd recommends, or `None` when no watchdog is configured.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.map(|w| w / 2)
    }

    /// `READY=1`, with a one-line status shown by `systemctl status`.
    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={status}"));
    }

    /// `STOPPING=1`: the node is shutting down (draining).
    pub fn stopping(&self) {
        self.send("STOPPING=1\nSTATUS=shutting down");
    }

    /// `WATCHDOG=1`: the node is alive.
    pub fn watchdog(&self) {
        self.send("WATCHDOG=1");
    }

    /// Pings the watchdog every [`Notifier::watchdog_interval`] from a task
    /// on the current tokio runtime, so a wedged runtime stops the pings
    /// and systemd restarts the node. Does nothing without a watchdog.
    pub fn spawn_watchdog(&self) -> Option<tokio::task::JoinHandle<()>> {
        let every = self.watchdog_interval()?;
        let this = self.clone();
        Some(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                this.watchdog();
            }
        }))
    }

    fn send(&self, message: &str) {
        let Some(target) = &self.target else {
            return;
        };
        if let Err(e) = send_to(target, message.as_bytes()) {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e, socket = ?target, "cannot notify systemd (NOTIFY_SOCKET); further failures are not logged");
            }
        }
    }
}

fn send_to(target: &NotifyTarget, message: &[u8]) -> std::io::Result<()> {
    let socket = UnixDatagram::unbound()?;
    let sent = match target {
        NotifyTarget::Path(path) => socket.send_to(message, path)?,
        NotifyTarget::Abstract(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(message, &addr)?
        }
    };
    if sent != message.len() {
        return Err(std::io::Error::other(format!(
            "sent {sent} of {} bytes",
            message.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    #[test]
    fn without_notify_socket_nothing_is_sent_and_no_watchdog_runs() {
        let n = Notifier::from_vars(None, os("1000000"), None, 7);
        assert!(!n.enabled());
        assert_eq!(n.watchdog_interval(), None);
        n.ready("x"); // must not panic or block
        let empty = Notifier::from_vars(os(""), None, None, 7);
        assert!(!empty.enabled());
    }

    #[test]
    fn watchdog_is_half_the_interval_and_only_for_the_named_pid() {
        let n = Notifier::from_vars(os("/run/x"), os("3000000"), os("7"), 7);
        assert_eq!(n.watchdog_interval(), Some(Duration::from_millis(1500)));
        let other = Notifier::from_vars(os("/run/x"), os("3000000"), os("8"), 7);
        assert_eq!(other.watchdog_interval(), None);
        let unset_pid = Notifier::from_vars(os("/run/x"), os("3000000"), None, 7);
        assert_eq!(
            unset_pid.watchdog_interval(),
            Some(Duration::from_millis(1500))
        );
        for bad in ["0", "soon", "-5"] {
            let n = Notifier::from_vars(os("/run/x"), os(bad), None, 7);
            assert_eq!(n.watchdog_interval(), None, "WATCHDOG_USEC={bad}");
        }
    }

    #[test]
    fn messages_reach_a_path_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).expect("bind");
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let n = Notifier::from_vars(Some(path.into_os_string()), None, None, 1);
        n.ready("serving");
        n.watchdog();
        n.stopping();
        let mut buf = [0u8; 256];
        let mut got = Vec::new();
        for _ in 0..3 {
            let len = server.recv(&mut buf).expect("a datagram");
            got.push(String::from_utf8_lossy(&buf[..len]).into_owned());
        }
        assert_eq!(
            got,
            [
                "READY=1\nSTATUS=serving",
                "WATCHDOG=1",
                "STOPPING=1\nSTATUS=shutting down"
            ]
        );
    }

    #[test]
    fn messages_reach_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("idgen-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .expect("abstract address");
        let server = UnixDatagram::bind_addr(&addr).expect("bind");
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let n = Notifier::from_vars(os(&format!("@{name}")), None, None, 1);
        n.ready("up");
        let mut buf = [0u8; 64];
        let len = server.recv(&mut buf).expect("a datagram");
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=up");
    }

    #[test]
    fn a_missing_socket_is_not_fatal() {
        let n = Notifier::from_vars(os("/nonexistent/idgen/notify"), None, None, 1);
        n.ready("x");
        n.stopping();
        assert!(n.warned.load(Ordering::Relaxed), "the failure was noticed");
    }
}
