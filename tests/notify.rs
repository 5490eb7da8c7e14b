//! `idgen serve` under systemd's notification protocol, against a fake
//! `NOTIFY_SOCKET`: READY=1 once it serves, WATCHDOG=1 at half
//! `WATCHDOG_USEC`, STOPPING=1 at SIGTERM.

mod common;

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use common::{wait_for_status, write_child_config, ChildServer};

fn recv(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    let len = socket.recv(&mut buf).expect("a notification within 10 s");
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_notifies_ready_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let config = write_child_config(dir.path(), true);
    let path = socket_path.to_str().unwrap();
    // 400 ms watchdog: a ping every 200 ms. WATCHDOG_PID unset: for us.
    let node = ChildServer::try_start_env(
        &config,
        &[],
        &[("NOTIFY_SOCKET", path), ("WATCHDOG_USEC", "400000")],
    )
    .expect("node starts");

    let first = recv(&socket);
    assert!(first.starts_with("READY=1\n"), "first message: {first:?}");
    assert!(
        first.contains(&format!("gRPC on {}", node.grpc)),
        "status names the port: {first:?}"
    );
    // READY means serving: the readiness probe agrees.
    let readyz = format!("http://{}/readyz", node.http);
    assert!(wait_for_status(&readyz, 200).await);

    for _ in 0..3 {
        assert_eq!(recv(&socket), "WATCHDOG=1");
    }

    let terminate = std::thread::spawn(move || node.terminate());
    // Watchdog pings may still be in flight; STOPPING=1 must follow.
    let mut seen = Vec::new();
    loop {
        let m = recv(&socket);
        if m.starts_with("STOPPING=1") {
            break;
        }
        assert_eq!(m, "WATCHDOG=1", "only pings before STOPPING, got {seen:?}");
        seen.push(m);
        assert!(seen.len() < 200, "no STOPPING=1 after {} pings", seen.len());
    }
    let status = terminate.join().expect("terminate thread");
    assert!(status.success(), "clean exit: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_pid_of_another_process_sends_no_pings() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let config = write_child_config(dir.path(), true);
    let node = ChildServer::try_start_env(
        &config,
        &[],
        &[
            ("NOTIFY_SOCKET", socket_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "100000"),
            // pid 1 is never the test's child.
            ("WATCHDOG_PID", "1"),
        ],
    )
    .expect("node starts");
    assert!(recv(&socket).starts_with("READY=1\n"));
    // At 50 ms pings, 500 ms would bring about ten; none must come.
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 64];
    match socket.recv(&mut buf) {
        Err(e)
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut => {}
        other => panic!("expected no message, got {other:?}"),
    }
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let terminate = std::thread::spawn(move || node.terminate());
    assert!(recv(&socket).starts_with("STOPPING=1"));
    assert!(terminate.join().unwrap().success());
}
