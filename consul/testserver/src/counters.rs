//! Request counters by agent and endpoint, so tests can measure a client's
//! steady-state traffic (for example, renewals per minute).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// Counts every request an agent received, by endpoint name, including
/// requests answered by an injected fault.
#[derive(Debug, Default)]
pub(crate) struct RequestCounters {
    counts: Mutex<HashMap<(String, &'static str), u64>>,
}

impl RequestCounters {
    pub(crate) fn record(&self, agent: &str, endpoint: &'static str) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        *counts.entry((agent.to_owned(), endpoint)).or_default() += 1;
    }

    /// Sum over one agent (or all with `None`) for one endpoint (or all
    /// with `"*"`).
    pub(crate) fn get(&self, agent: Option<&str>, endpoint: &str) -> u64 {
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts
            .iter()
            .filter(|((a, e), _)| {
                agent.is_none_or(|want| want == a) && (endpoint == "*" || endpoint == *e)
            })
            .map(|(_, n)| *n)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_by_agent_and_endpoint() {
        let c = RequestCounters::default();
        c.record("agent-0", "kv");
        c.record("agent-0", "kv");
        c.record("agent-1", "kv");
        c.record("agent-1", "txn");
        assert_eq!(c.get(Some("agent-0"), "kv"), 2);
        assert_eq!(c.get(None, "kv"), 3);
        assert_eq!(c.get(Some("agent-1"), "*"), 2);
        assert_eq!(c.get(Some("agent-2"), "*"), 0);
    }
}
