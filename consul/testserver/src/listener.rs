//! One agent's HTTP listener: the accept loop, which also closes and reopens
//! the socket for the `refuse` fault, and the per-connection tasks.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::faults::{AgentFaults, FaultState};
use crate::http::AgentContext;

/// Binds a listening socket with `SO_REUSEADDR`, so an agent can listen
/// again on the address it had before a `refuse` fault.
pub(crate) fn bind_reusable(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Serves `agent` until shutdown. `listener` is already registered in the
/// agent's fault slot.
pub(crate) async fn accept_loop(
    agent: Arc<AgentContext>,
    listener: Arc<TcpListener>,
    tls: Option<TlsAcceptor>,
) {
    let faults = agent.faults.clone();
    let mut fault_rx = faults.state.subscribe();
    let mut shutdown = agent.cluster.shutdown.clone();
    let mut listener = Some(listener);
    let mut connections = JoinSet::new();
    loop {
        if *shutdown.borrow_and_update() {
            break;
        }
        let refused = fault_rx.borrow_and_update().refuse;
        if refused {
            listener = None;
            tokio::select! {
                changed = fault_rx.changed() => if changed.is_err() { break },
                _ = shutdown.changed() => break,
                Some(_) = connections.join_next() => {}
            }
            continue;
        }
        let Some(active) = listener.clone().or_else(|| relisten(&faults)) else {
            // Someone else holds the port for now; retry shortly.
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                _ = shutdown.changed() => break,
            }
            continue;
        };
        listener = Some(active.clone());
        tokio::select! {
            accepted = active.accept() => match accepted {
                Ok((stream, _)) => match &tls {
                    Some(acceptor) => {
                        let (agent, acceptor) = (agent.clone(), acceptor.clone());
                        connections.spawn(async move {
                            if let Some(stream) = crate::tls::accept(&acceptor, stream).await {
                                serve_connection(agent, stream).await;
                            }
                        });
                    }
                    None => {
                        connections.spawn(serve_connection(agent.clone(), stream));
                    }
                },
                Err(e) => {
                    if !faults.current().refuse {
                        // Out of descriptors or similar: back off, keep serving.
                        tracing::warn!(agent = %agent.name, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    if faults.slot().active.is_none() {
                        listener = None;
                    }
                }
            },
            changed = fault_rx.changed() => if changed.is_err() { break },
            _ = shutdown.changed() => break,
            Some(_) = connections.join_next() => {}
        }
    }
    connections.shutdown().await;
}

/// Listens again after a refusal: takes the socket `Faults::refuse` bound
/// or binds one, and publishes it in the slot.
fn relisten(faults: &AgentFaults) -> Option<Arc<TcpListener>> {
    let mut slot = faults.slot();
    if faults.current().refuse {
        return None;
    }
    if let Some(active) = &slot.active {
        return Some(active.clone());
    }
    let std_listener = match slot.rebound.take() {
        Some(l) => l,
        None => bind_reusable(slot.addr?).ok()?,
    };
    let listener = Arc::new(TcpListener::from_std(std_listener).ok()?);
    slot.active = Some(listener.clone());
    Some(listener)
}

fn is_refused(state: &FaultState, epoch: u64) -> bool {
    state.refuse || state.refuse_epoch != epoch
}

/// Serves one HTTP/1.1 connection until it ends, the agent starts refusing,
/// or the server shuts down.
async fn serve_connection<S>(agent: Arc<AgentContext>, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut fault_rx = agent.faults.state.subscribe();
    let epoch = fault_rx.borrow_and_update().refuse_epoch;
    if fault_rx.borrow().refuse {
        return;
    }
    let mut shutdown = agent.cluster.shutdown.clone();
    let service = TowerToHyperService::new(agent.router());
    let connection = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    loop {
        tokio::select! {
            result = &mut connection => {
                if let Err(e) = result {
                    tracing::debug!(agent = %agent.name, error = %e, "connection ended");
                }
                return;
            }
            changed = fault_rx.changed() => {
                if changed.is_err() || is_refused(&fault_rx.borrow_and_update(), epoch) {
                    return;
                }
            }
            _ = shutdown.changed() => return,
        }
    }
}
