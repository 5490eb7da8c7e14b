//! An idgen node for the benches: its own 2-thread runtime and thread,
//! as a separate process would have, on an embedded store in a temporary
//! directory.

use std::sync::Arc;

use idgen::config::{FileConfig, TlsSettings};
use idgen::id::{Clock, SystemClock};
use idgen::node::Node;

/// A running node; stopped when dropped.
pub struct IdgenServer {
    /// The gRPC address.
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl IdgenServer {
    /// A plaintext node.
    #[allow(dead_code)]
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// A node serving TLS with `tls`, or plaintext.
    pub fn start_with(tls: Option<TlsSettings>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut f = FileConfig::default();
        f.store.path = dir.path().join("bench.redb");
        f.store.init_if_missing = true;
        let mut config = f.validate(SystemClock.now_millis()).expect("config");
        config.server.tls = tls;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let http = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        http.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let node = Node::start(config, Arc::new(SystemClock))
                    .await
                    .expect("node");
                let grpc = tokio::net::TcpListener::from_std(listener).expect("listener");
                let http = tokio::net::TcpListener::from_std(http).expect("listener");
                let _ = ready_tx.send(());
                node.serve(grpc, http, async {
                    let _ = stopped.await;
                })
                .await
                .expect("serve");
            });
        });
        ready_rx.recv().expect("idgen server started");
        Self {
            addr,
            stop: Some(stop),
            thread: Some(thread),
            _dir: dir,
        }
    }
}

impl Drop for IdgenServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
