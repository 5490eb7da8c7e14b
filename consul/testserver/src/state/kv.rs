//! The KV table: entries, the table index (which deletes also move), and
//! per-key lock-delays.
//!
//! Every write takes `idx`, the index the write would get, and reports
//! whether it changed anything; the caller bumps the global index only then.
//! A transaction runs the same methods on a clone and keeps it only if every
//! operation succeeded.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use super::session::Behavior;
use super::{ClusterState, StateError};

/// One key as a client sees it (`GET /v1/kv/<key>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEntry {
    /// The full key, without a leading `/`.
    pub key: String,
    /// Index of the write that created the key.
    pub create_index: u64,
    /// Index of the last write that changed the key.
    pub modify_index: u64,
    /// How many times a new session has acquired the key.
    pub lock_index: u64,
    /// Opaque client flags.
    pub flags: u64,
    /// The value (empty is sent as JSON `null`).
    pub value: Vec<u8>,
    /// The session holding the lock, if any.
    pub session: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct KvStore {
    entries: BTreeMap<String, KvEntry>,
    /// Highest index of any KV write, deletes included.
    table_index: u64,
    /// Index at which each deleted key went away, so a prefix listing can
    /// report a delete inside the prefix the way Consul's tombstones do.
    tombstones: BTreeMap<String, u64>,
    lock_delays: HashMap<String, Instant>,
}

/// Rejects keys Consul would refuse or that would escape a prefix.
pub(crate) fn validate_key(key: &str) -> Result<(), String> {
    if key.starts_with('/') {
        return Err(format!("Invalid key {key:?}: must not start with '/'"));
    }
    if key.contains("..") {
        return Err(format!("Invalid key {key:?}: must not contain '..'"));
    }
    Ok(())
}

impl KvStore {
    pub(crate) fn get(&self, key: &str) -> Option<&KvEntry> {
        self.entries.get(key)
    }

    pub(crate) fn table_index(&self) -> u64 {
        self.table_index
    }

    pub(crate) fn list<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a KvEntry> + 'a {
        self.entries
            .range(prefix.to_owned()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(_, e)| e)
    }

    /// The index a blocking listing of `prefix` waits on: the newest change
    /// inside the prefix (writes and deletes), else the table index.
    pub(crate) fn prefix_index(&self, prefix: &str) -> u64 {
        let written = self.list(prefix).map(|e| e.modify_index).max();
        let deleted = self
            .tombstones
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, i)| *i)
            .max();
        match written.max(deleted) {
            Some(i) if i > 0 => i,
            _ => self.table_index,
        }
    }

    pub(crate) fn in_lock_delay(&self, key: &str, now: Instant) -> bool {
        self.lock_delays.get(key).is_some_and(|until| now < *until)
    }

    /// The table as a snapshot holds it: entries with every index, the
    /// table index and the delete tombstones. Lock-delays are left out:
    /// Consul keeps them in the leader's memory only (`state/delay.go`).
    pub(crate) fn snapshot_parts(&self) -> (Vec<&KvEntry>, u64, &BTreeMap<String, u64>) {
        (
            self.entries.values().collect(),
            self.table_index,
            &self.tombstones,
        )
    }

    /// A table restored from a snapshot's parts: indexes as they were
    /// when it was taken, no lock-delays.
    pub(crate) fn restored(
        entries: Vec<KvEntry>,
        table_index: u64,
        tombstones: BTreeMap<String, u64>,
    ) -> Self {
        KvStore {
            entries: entries.into_iter().map(|e| (e.key.clone(), e)).collect(),
            table_index,
            tombstones,
            lock_delays: HashMap::new(),
        }
    }

    /// Drops every lock-delay (a new leader starts without them).
    pub(crate) fn forget_lock_delays(&mut self) {
        self.lock_delays.clear();
    }

    /// Writes an entry unless it would be byte-identical to what is there
    /// (Consul then keeps the old ModifyIndex).
    fn write(
        &mut self,
        idx: u64,
        key: &str,
        value: Vec<u8>,
        flags: u64,
        session: Option<String>,
        lock_index: u64,
    ) -> bool {
        let create_index = match self.entries.get(key) {
            Some(e) => {
                if e.value == value
                    && e.flags == flags
                    && e.session == session
                    && e.lock_index == lock_index
                {
                    return false;
                }
                e.create_index
            }
            None => idx,
        };
        self.entries.insert(
            key.to_owned(),
            KvEntry {
                key: key.to_owned(),
                create_index,
                modify_index: idx,
                lock_index,
                flags,
                value,
                session,
            },
        );
        self.tombstones.remove(key);
        self.table_index = idx;
        true
    }

    /// Unconditional set. Like Consul's `kvsSetTxn` it keeps the lock
    /// holder but writes LockIndex 0 (the entry's LockIndex comes from the
    /// request, which has none), so LockIndex is no fencing token.
    pub(crate) fn set(&mut self, idx: u64, key: &str, value: Vec<u8>, flags: u64) -> bool {
        let session = self.entries.get(key).and_then(|e| e.session.clone());
        self.write(idx, key, value, flags, session, 0)
    }

    /// Check-and-set: `expect == 0` creates only; otherwise ModifyIndex must
    /// match. `None` means the check failed; `Some(changed)` otherwise.
    pub(crate) fn cas(
        &mut self,
        idx: u64,
        key: &str,
        value: Vec<u8>,
        flags: u64,
        expect: u64,
    ) -> Option<bool> {
        let current = self.entries.get(key).map(|e| e.modify_index);
        match (expect, current) {
            (0, None) => {}
            (e, Some(m)) if e == m => {}
            _ => return None,
        }
        Some(self.set(idx, key, value, flags))
    }

    /// Takes the lock for `session`; `None` when another session holds it.
    pub(crate) fn lock(
        &mut self,
        idx: u64,
        key: &str,
        value: Vec<u8>,
        flags: u64,
        session: &str,
    ) -> Option<bool> {
        let lock_index = match self.entries.get(key) {
            Some(e) => match e.session.as_deref() {
                Some(holder) if holder == session => e.lock_index,
                Some(_) => return None,
                None => e.lock_index + 1,
            },
            None => 1,
        };
        Some(self.write(idx, key, value, flags, Some(session.to_owned()), lock_index))
    }

    /// Releases the lock if `session` holds it; `None` otherwise.
    pub(crate) fn unlock(
        &mut self,
        idx: u64,
        key: &str,
        value: Vec<u8>,
        flags: u64,
        session: &str,
    ) -> Option<bool> {
        let lock_index = match self.entries.get(key) {
            Some(e) if e.session.as_deref() == Some(session) => e.lock_index,
            _ => return None,
        };
        Some(self.write(idx, key, value, flags, None, lock_index))
    }

    pub(crate) fn delete(&mut self, idx: u64, key: &str) -> bool {
        if self.entries.remove(key).is_none() {
            return false;
        }
        self.tombstones.insert(key.to_owned(), idx);
        self.table_index = idx;
        true
    }

    pub(crate) fn delete_tree(&mut self, idx: u64, prefix: &str) -> bool {
        let keys: Vec<String> = self.list(prefix).map(|e| e.key.clone()).collect();
        let mut changed = false;
        for key in keys {
            changed |= self.delete(idx, &key);
        }
        changed
    }

    /// Delete if ModifyIndex matches; a missing key counts as success.
    /// `None` means the index did not match.
    pub(crate) fn delete_cas(&mut self, idx: u64, key: &str, expect: u64) -> Option<bool> {
        match self.entries.get(key) {
            None => Some(false),
            Some(e) if e.modify_index == expect => Some(self.delete(idx, key)),
            Some(_) => None,
        }
    }

    /// Applies a session's invalidation to the keys it holds: release keeps
    /// the value and clears the holder, delete removes the key. Either way
    /// the key enters its lock-delay, if any.
    fn drop_session_locks(
        &mut self,
        idx: u64,
        session: &str,
        behavior: Behavior,
        delay_until: Option<Instant>,
    ) -> bool {
        let held: Vec<String> = self
            .entries
            .values()
            .filter(|e| e.session.as_deref() == Some(session))
            .map(|e| e.key.clone())
            .collect();
        let mut changed = false;
        for key in held {
            changed |= match behavior {
                Behavior::Delete => self.delete(idx, &key),
                Behavior::Release => match self.entries.get(&key) {
                    Some(e) => {
                        let (value, flags, lock_index) = (e.value.clone(), e.flags, e.lock_index);
                        self.write(idx, &key, value, flags, None, lock_index)
                    }
                    None => false,
                },
            };
            if let Some(until) = delay_until {
                self.lock_delays.insert(key, until);
            }
        }
        changed
    }
}

/// The condition on a `PUT /v1/kv/<key>` (mutually exclusive in the API).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PutMode {
    Set,
    Cas(u64),
    Acquire(String),
    Release(String),
}

/// The condition on a `DELETE /v1/kv/<key>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeleteMode {
    One,
    Recurse,
    Cas(u64),
}

impl ClusterState {
    /// `PUT /v1/kv/<key>`; the boolean is the response body.
    pub(crate) fn kv_put(
        &mut self,
        key: &str,
        value: Vec<u8>,
        flags: u64,
        mode: &PutMode,
        now: Instant,
    ) -> Result<bool, StateError> {
        let idx = self.index + 1;
        let (ok, changed) = match mode {
            PutMode::Set => (true, self.kv.set(idx, key, value, flags)),
            PutMode::Cas(expect) => match self.kv.cas(idx, key, value, flags, *expect) {
                Some(changed) => (true, changed),
                None => (false, false),
            },
            PutMode::Acquire(session) => {
                if !self.sessions.contains_key(session) {
                    return Err(StateError::InvalidSession(session.clone()));
                }
                if self.kv.in_lock_delay(key, now) {
                    (false, false)
                } else {
                    match self.kv.lock(idx, key, value, flags, session) {
                        Some(changed) => (true, changed),
                        None => (false, false),
                    }
                }
            }
            PutMode::Release(session) => match self.kv.unlock(idx, key, value, flags, session) {
                Some(changed) => (true, changed),
                None => (false, false),
            },
        };
        if changed {
            self.index = idx;
        }
        Ok(ok)
    }

    /// `DELETE /v1/kv/<key>`; the boolean is the response body.
    pub(crate) fn kv_delete(&mut self, key: &str, mode: DeleteMode) -> bool {
        let idx = self.index + 1;
        let (ok, changed) = match mode {
            DeleteMode::One => (true, self.kv.delete(idx, key)),
            DeleteMode::Recurse => (true, self.kv.delete_tree(idx, key)),
            DeleteMode::Cas(expect) => match self.kv.delete_cas(idx, key, expect) {
                Some(changed) => (true, changed),
                None => (false, false),
            },
        };
        if changed {
            self.index = idx;
        }
        ok
    }

    /// Releases or deletes what `session` held, at index `idx`.
    pub(super) fn kv_drop_session_locks(
        &mut self,
        idx: u64,
        session: &str,
        behavior: Behavior,
        delay_until: Option<Instant>,
    ) -> bool {
        self.kv
            .drop_session_locks(idx, session, behavior, delay_until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn identical_write_keeps_modify_index() {
        let mut kv = KvStore::default();
        assert!(kv.set(1, "a", b"x".to_vec(), 0));
        assert!(!kv.set(2, "a", b"x".to_vec(), 0));
        assert_eq!(kv.get("a").map(|e| e.modify_index), Some(1));
        assert!(
            kv.set(3, "a", b"x".to_vec(), 7),
            "flags are part of the entry"
        );
        assert_eq!(
            kv.get("a").map(|e| (e.create_index, e.modify_index)),
            Some((1, 3))
        );
    }

    #[test]
    fn cas_zero_creates_only_and_cas_n_matches_modify_index() {
        let mut kv = KvStore::default();
        assert_eq!(kv.cas(1, "a", b"1".to_vec(), 0, 0), Some(true));
        assert_eq!(kv.cas(2, "a", b"2".to_vec(), 0, 0), None);
        assert_eq!(kv.cas(2, "a", b"2".to_vec(), 0, 5), None);
        assert_eq!(kv.cas(2, "a", b"2".to_vec(), 0, 1), Some(true));
        assert_eq!(kv.get("a").map(|e| e.value.clone()), Some(b"2".to_vec()));
    }

    #[test]
    fn lock_index_counts_new_holders_only() {
        let mut kv = KvStore::default();
        assert_eq!(kv.lock(1, "l", vec![], 0, "s1"), Some(true));
        assert_eq!(kv.lock(2, "l", b"v".to_vec(), 0, "s1"), Some(true));
        assert_eq!(kv.get("l").map(|e| e.lock_index), Some(1));
        assert_eq!(kv.lock(3, "l", vec![], 0, "s2"), None);
        assert_eq!(kv.unlock(3, "l", vec![], 0, "s2"), None);
        assert_eq!(kv.unlock(3, "l", b"v".to_vec(), 0, "s1"), Some(true));
        assert_eq!(kv.lock(4, "l", b"v".to_vec(), 0, "s2"), Some(true));
        let e = kv.get("l").cloned();
        assert_eq!(e.as_ref().map(|e| e.lock_index), Some(2));
        assert_eq!(e.and_then(|e| e.session), Some("s2".to_owned()));
    }

    #[test]
    fn set_and_cas_on_a_locked_key_keep_the_holder_and_reset_lock_index() {
        let mut kv = KvStore::default();
        assert_eq!(kv.lock(1, "l", b"v".to_vec(), 0, "s1"), Some(true));
        assert!(kv.set(2, "l", b"w".to_vec(), 0));
        let e = kv.get("l").cloned();
        assert_eq!(e.as_ref().map(|e| e.lock_index), Some(0));
        assert_eq!(e.and_then(|e| e.session), Some("s1".to_owned()));
        // The holder locking again keeps LockIndex 0: nothing changes.
        assert_eq!(kv.lock(3, "l", b"w".to_vec(), 0, "s1"), Some(false));
        assert_eq!(kv.cas(4, "l", b"x".to_vec(), 0, 1), None, "stale index");
        assert_eq!(kv.cas(4, "l", b"x".to_vec(), 0, 2), Some(true));
        let e = kv.get("l").cloned();
        assert_eq!(e.as_ref().map(|e| e.lock_index), Some(0));
        assert_eq!(e.and_then(|e| e.session), Some("s1".to_owned()));
    }

    #[test]
    fn release_on_invalidation_keeps_value_and_sets_lock_delay() {
        let mut kv = KvStore::default();
        let now = Instant::now();
        kv.lock(1, "l", b"v".to_vec(), 0, "s1");
        kv.set(2, "other", b"o".to_vec(), 0);
        let until = now + Duration::from_secs(15);
        assert!(kv.drop_session_locks(3, "s1", Behavior::Release, Some(until)));
        let e = kv.get("l").cloned();
        assert_eq!(e.as_ref().map(|e| e.value.clone()), Some(b"v".to_vec()));
        assert_eq!(e.as_ref().map(|e| e.modify_index), Some(3));
        assert_eq!(e.and_then(|e| e.session), None);
        assert!(kv.in_lock_delay("l", now));
        assert!(!kv.in_lock_delay("l", until));
        assert!(!kv.in_lock_delay("other", now));
    }

    #[test]
    fn deletes_move_the_prefix_index() {
        let mut kv = KvStore::default();
        kv.set(1, "p/a", vec![], 0);
        kv.set(2, "q/a", vec![], 0);
        assert_eq!(kv.prefix_index("p/"), 1);
        assert!(kv.delete(3, "p/a"));
        assert_eq!(kv.prefix_index("p/"), 3);
        assert_eq!(kv.delete_cas(4, "missing", 9), Some(false));
        assert_eq!(kv.delete_cas(4, "q/a", 9), None);
        assert_eq!(kv.delete_cas(4, "q/a", 2), Some(true));
        assert_eq!(kv.table_index(), 4);
    }

    #[test]
    fn keys_are_validated() {
        assert!(validate_key("idgen/workers/1").is_ok());
        assert!(validate_key("/idgen").is_err());
        assert!(validate_key("idgen/../x").is_err());
    }
}
