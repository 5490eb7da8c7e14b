//! The cluster's timer task: sleeps until the earliest deadline in the
//! state (session TTL, check TTL, critical-service reaping) and fires what
//! is due. Writes that may move a deadline wake it early.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster::Cluster;

/// How long to sleep when nothing is scheduled; any write wakes it sooner.
const IDLE: Duration = Duration::from_secs(3600);

pub(crate) async fn run(cluster: Arc<Cluster>) {
    let mut shutdown = cluster.shutdown.clone();
    loop {
        if *shutdown.borrow_and_update() {
            return;
        }
        let paused = cluster.faults.sessions_paused();
        let next = cluster.read(|st| st.next_deadline(paused));
        let sleep = match next {
            Some(at) => tokio::time::sleep_until(at.into()),
            None => tokio::time::sleep(IDLE),
        };
        tokio::select! {
            _ = sleep => {}
            _ = cluster.timers_woken() => {}
            _ = shutdown.changed() => return,
        }
        let paused = cluster.faults.sessions_paused();
        let now = Instant::now();
        cluster.write_quietly(|st| st.run_timers(now, paused));
    }
}
