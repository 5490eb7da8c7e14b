//! Fault injection, per agent: refused connections, slow answers, a lost
//! leader, black-holed requests; and, cluster-wide, paused session expiry
//! and leader elections.

use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::cluster::Cluster;
use crate::listener::bind_reusable;

/// The faults in force on one agent.
#[derive(Debug, Clone, Default)]
pub(crate) struct FaultState {
    pub(crate) refuse: bool,
    /// Bumped by every `refuse(.., true)`, so a connection notices a refusal
    /// even if it was lifted before the connection task looked.
    pub(crate) refuse_epoch: u64,
    pub(crate) delay: Option<Duration>,
    pub(crate) no_leader: bool,
    pub(crate) drop_requests: bool,
}

/// The listening socket of an agent, shared with its accept loop so that
/// `refuse` can close it synchronously: when `refuse(.., true)` returns, new
/// connections are already refused, and when `refuse(.., false)` returns,
/// they are accepted again.
#[derive(Debug, Default)]
pub(crate) struct ListenerSlot {
    pub(crate) addr: Option<SocketAddr>,
    pub(crate) active: Option<Arc<TcpListener>>,
    pub(crate) rebound: Option<std::net::TcpListener>,
}

/// One agent's fault switches.
#[derive(Debug)]
pub(crate) struct AgentFaults {
    pub(crate) state: watch::Sender<FaultState>,
    pub(crate) listener: Mutex<ListenerSlot>,
}

impl AgentFaults {
    fn new() -> Self {
        AgentFaults {
            state: watch::Sender::new(FaultState::default()),
            listener: Mutex::new(ListenerSlot::default()),
        }
    }

    pub(crate) fn current(&self) -> FaultState {
        self.state.borrow().clone()
    }

    pub(crate) fn slot(&self) -> std::sync::MutexGuard<'_, ListenerSlot> {
        self.listener.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Faults of every agent, created on first use so a test may arm a fault
/// before the agent starts.
#[derive(Debug, Default)]
pub(crate) struct FaultTable {
    agents: Mutex<HashMap<String, Arc<AgentFaults>>>,
    sessions_paused: AtomicBool,
    /// A key written one higher just before every txn that checks it:
    /// [`Faults::write_before_each_txn`].
    pub(crate) rewritten_before_txn: Mutex<Option<String>>,
}

impl FaultTable {
    pub(crate) fn agent(&self, name: &str) -> Arc<AgentFaults> {
        let mut agents = self.agents.lock().unwrap_or_else(PoisonError::into_inner);
        agents
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(AgentFaults::new()))
            .clone()
    }

    /// Every agent with fault switches: each started agent, and any armed
    /// before it started.
    pub(crate) fn agent_names(&self) -> Vec<String> {
        let agents = self.agents.lock().unwrap_or_else(PoisonError::into_inner);
        agents.keys().cloned().collect()
    }

    pub(crate) fn sessions_paused(&self) -> bool {
        self.sessions_paused.load(Ordering::SeqCst)
    }

    /// The key to rewrite before a txn, when armed.
    pub(crate) fn rewritten_before_txn(&self) -> Option<String> {
        self.rewritten_before_txn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Switches faults on and off. Cheap to clone; every change takes effect
/// before the call returns (for requests that arrive afterwards).
#[derive(Debug, Clone)]
pub struct Faults {
    pub(crate) cluster: Arc<Cluster>,
}

impl Faults {
    /// Refuses connections to `agent`: its listening socket is closed (new
    /// connections get ECONNREFUSED) and open connections are closed, with
    /// any request on them left unanswered. Turning it off listens on the
    /// same address again.
    pub fn refuse(&self, agent: &str, on: bool) {
        let faults = self.cluster.faults.agent(agent);
        if on {
            faults.state.send_modify(|s| {
                s.refuse = true;
                s.refuse_epoch += 1;
            });
            let mut slot = faults.slot();
            if let Some(listener) = slot.active.take() {
                // Shutting a listening socket resets its backlog and makes
                // the port refuse at once, even while the accept loop still
                // holds the socket.
                if let Err(e) = socket2::SockRef::from(listener.as_ref()).shutdown(Shutdown::Both) {
                    tracing::warn!(agent, error = %e, "could not shut the listening socket");
                }
            }
        } else {
            {
                let mut slot = faults.slot();
                if faults.current().refuse && slot.active.is_none() && slot.rebound.is_none() {
                    if let Some(addr) = slot.addr {
                        match bind_reusable(addr) {
                            Ok(listener) => slot.rebound = Some(listener),
                            // The accept loop retries the bind itself.
                            Err(e) => tracing::warn!(agent, %addr, error = %e, "rebind failed"),
                        }
                    }
                }
            }
            faults.state.send_modify(|s| s.refuse = false);
        }
    }

    /// Delays every answer of `agent` by `d` (`None` to stop). The request
    /// is processed first, so a write that the client gave up on may still
    /// have been applied, as with a real slow server.
    pub fn delay(&self, agent: &str, d: Option<Duration>) {
        self.cluster
            .faults
            .agent(agent)
            .state
            .send_modify(|s| s.delay = d);
    }

    /// Answers every request to `agent` with 500 `No cluster leader`,
    /// without applying it.
    pub fn no_leader(&self, agent: &str, on: bool) {
        self.cluster
            .faults
            .agent(agent)
            .state
            .send_modify(|s| s.no_leader = on);
    }

    /// Accepts requests to `agent` and never answers them (until the client
    /// gives up); they are not applied.
    pub fn drop_requests(&self, agent: &str, on: bool) {
        self.cluster
            .faults
            .agent(agent)
            .state
            .send_modify(|s| s.drop_requests = on);
    }

    /// Before every txn that has an op on `key` (a decimal number, such as
    /// a high-water mark), writes `key` one higher (a new ModifyIndex), as
    /// a writer that always lands between a client's read and its txn
    /// would: every `check-index` or `cas` on the key then fails. `None`
    /// turns it off.
    pub fn write_before_each_txn(&self, key: Option<&str>) {
        *self
            .cluster
            .faults
            .rewritten_before_txn
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = key.map(str::to_owned);
    }

    /// Stops session TTL expiry cluster-wide, like a leader whose timers
    /// stall. Renewals still move deadlines; on resume, every session whose
    /// deadline passed meanwhile is invalidated at once.
    pub fn pause_session_expiry(&self, on: bool) {
        self.cluster
            .faults
            .sessions_paused
            .store(on, Ordering::SeqCst);
        self.cluster.wake_timers();
    }

    /// A leader election, as Consul's new leader sees the cluster: every
    /// session's TTL timer restarts at 2 x TTL from now
    /// (`agent/consul/session_ttl.go`, `initializeSessionTimers`, whatever
    /// [`Config::ttl_expiry_factor`](crate::Config::ttl_expiry_factor)
    /// says), so a session whose holder stopped renewing lives on well past
    /// its last renew + 2 x TTL; and the lock-delays the old leader kept in
    /// memory (`state/delay.go`) are forgotten. Returns the number of
    /// sessions whose timer restarted.
    pub fn leader_election(&self) -> usize {
        let now = std::time::Instant::now();
        let restarted = self.cluster.write(|st| st.leader_elected(now));
        self.cluster.wake_timers();
        restarted
    }

    /// Cuts this handle's datacenter off from every other linked one (a
    /// WAN partition), or heals the cut: while on, a `?dc=` request from
    /// here to another datacenter, or from another one to here, answers
    /// 500 `Remote DC has no server currently reachable` (Consul's
    /// `ErrDCNotAvailable`: the datacenter is known but none of its
    /// servers answers) and is not applied. Requests for the local
    /// datacenter are served as usual.
    pub fn wan_partition(&self, on: bool) {
        self.cluster.set_partitioned(on);
    }

    /// The whole datacenter down, or back: [`wan_partition`](Self::wan_partition)
    /// plus [`refuse`](Self::refuse) on each of its agents, so neither its
    /// own clients nor other datacenters reach it. Its state is kept, as
    /// Consul servers restarting with their data would keep it.
    pub fn datacenter_down(&self, on: bool) {
        self.wan_partition(on);
        for agent in self.cluster.faults.agent_names() {
            self.refuse(&agent, on);
        }
    }
}
