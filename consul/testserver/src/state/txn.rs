//! `PUT /v1/txn`: KV operations applied all-or-nothing under one index.

use std::time::Instant;

use super::kv::{validate_key, KvEntry, KvStore};
use super::ClusterState;

/// A KV verb of a transaction operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxnVerb {
    Set,
    Cas,
    Lock,
    Unlock,
    Get,
    GetOrEmpty,
    GetTree,
    CheckIndex,
    CheckSession,
    CheckNotExists,
    Delete,
    DeleteTree,
    DeleteCas,
}

impl TxnVerb {
    pub(crate) fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "set" => TxnVerb::Set,
            "cas" => TxnVerb::Cas,
            "lock" => TxnVerb::Lock,
            "unlock" => TxnVerb::Unlock,
            "get" => TxnVerb::Get,
            "get-or-empty" => TxnVerb::GetOrEmpty,
            "get-tree" => TxnVerb::GetTree,
            "check-index" => TxnVerb::CheckIndex,
            "check-session" => TxnVerb::CheckSession,
            "check-not-exists" => TxnVerb::CheckNotExists,
            "delete" => TxnVerb::Delete,
            "delete-tree" => TxnVerb::DeleteTree,
            "delete-cas" => TxnVerb::DeleteCas,
            _ => return None,
        })
    }

    /// Whether the verb needs write access (otherwise read access).
    pub(crate) fn writes(self) -> bool {
        matches!(
            self,
            TxnVerb::Set
                | TxnVerb::Cas
                | TxnVerb::Lock
                | TxnVerb::Unlock
                | TxnVerb::Delete
                | TxnVerb::DeleteTree
                | TxnVerb::DeleteCas
        )
    }

    /// Whether the key names a prefix rather than one key.
    pub(crate) fn is_tree(self) -> bool {
        matches!(self, TxnVerb::GetTree | TxnVerb::DeleteTree)
    }
}

/// One decoded `{"KV": {...}}` operation.
#[derive(Debug, Clone)]
pub(crate) struct TxnOp {
    pub(crate) verb: TxnVerb,
    pub(crate) key: String,
    pub(crate) value: Vec<u8>,
    pub(crate) flags: u64,
    pub(crate) index: u64,
    pub(crate) session: String,
}

/// One entry of the 409 answer's `Errors`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TxnError {
    pub(crate) op_index: usize,
    pub(crate) what: String,
}

/// Blanks the value, as Consul does for results of non-read verbs.
fn without_value(entry: &KvEntry) -> KvEntry {
    KvEntry {
        value: Vec::new(),
        ..entry.clone()
    }
}

impl ClusterState {
    /// Writes `key`, a decimal number, again one higher, at a new index
    /// (a fault, [`Faults::write_before_each_txn`](crate::Faults::write_before_each_txn)):
    /// a write of the same value would not move its ModifyIndex. Nothing
    /// when it does not exist or holds no decimal number.
    pub(crate) fn rewrite(&mut self, key: &str) {
        let Some(e) = self.kv.get(key) else {
            return;
        };
        let Some(n) = std::str::from_utf8(&e.value)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
        else {
            return;
        };
        let flags = e.flags;
        self.index += 1;
        self.kv
            .set(self.index, key, (n + 1).to_string().into_bytes(), flags);
    }

    /// Runs `ops` against a copy of the KV table and keeps it only if all of
    /// them succeed. Every write gets the same new index, like one raft
    /// entry. Errors are collected for every failing operation.
    ///
    /// `lock` honours lock-delay as `?acquire` does: Consul's txn endpoint
    /// checks it before the transaction goes to raft (`txn_endpoint.go`,
    /// `preCheck` -> `kvsPreApply`) and answers `failed to lock key "<k>"
    /// due to lock delay`. Lock-delays are taken at `now`.
    pub(crate) fn txn(
        &mut self,
        ops: &[TxnOp],
        now: Instant,
    ) -> Result<Vec<KvEntry>, Vec<TxnError>> {
        let idx = self.index + 1;
        let mut kv = self.kv.clone();
        let mut changed = false;
        let mut results = Vec::new();
        let mut errors = Vec::new();
        for (op_index, op) in ops.iter().enumerate() {
            let key = op.key.as_str();
            let fail = |what: String| TxnError { op_index, what };
            if let Err(what) = validate_key(key) {
                errors.push(fail(what));
                continue;
            }
            if key.is_empty() && !op.verb.is_tree() {
                errors.push(fail("Missing key name".to_owned()));
                continue;
            }
            match self.txn_op(&mut kv, idx, op, now, &mut results) {
                Ok(c) => changed |= c,
                Err(what) => errors.push(fail(what)),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        self.kv = kv;
        if changed {
            self.index = idx;
        }
        Ok(results)
    }

    /// Applies one operation to `kv` (the transaction's copy), adding what
    /// it answers to `results`. `Ok(true)`: it changed the table.
    fn txn_op(
        &self,
        kv: &mut KvStore,
        idx: u64,
        op: &TxnOp,
        now: Instant,
        results: &mut Vec<KvEntry>,
    ) -> Result<bool, String> {
        let key = op.key.as_str();
        let value = || op.value.clone();
        let changed = match op.verb {
            TxnVerb::Set => kv.set(idx, key, value(), op.flags),
            TxnVerb::Cas => kv
                .cas(idx, key, value(), op.flags, op.index)
                .ok_or_else(|| format!("failed to set key {key:?}, index is stale"))?,
            TxnVerb::Lock => {
                if !self.sessions.contains_key(&op.session) {
                    return Err(format!("invalid session {:?}", op.session));
                }
                if kv.in_lock_delay(key, now) {
                    return Err(format!("failed to lock key {key:?} due to lock delay"));
                }
                kv.lock(idx, key, value(), op.flags, &op.session)
                    .ok_or_else(|| format!("failed to lock key {key:?}, lock is already held"))?
            }
            TxnVerb::Unlock => kv.unlock(idx, key, value(), op.flags, &op.session).ok_or_else(|| {
                format!("failed to unlock key {key:?}, lock isn't held, or is held by another session")
            })?,
            TxnVerb::Delete => return Ok(kv.delete(idx, key)),
            TxnVerb::DeleteTree => return Ok(kv.delete_tree(idx, key)),
            TxnVerb::DeleteCas => {
                return kv
                    .delete_cas(idx, key, op.index)
                    .ok_or_else(|| format!("failed to delete key {key:?}, index is stale"))
            }
            _ => return txn_read(kv, op, results).map(|()| false),
        };
        // Set, cas, lock and unlock answer the entry as written, blanked.
        results.extend(kv.get(key).map(without_value));
        Ok(changed)
    }
}

/// The verbs that only read or check: they add to `results` or fail.
fn txn_read(kv: &KvStore, op: &TxnOp, results: &mut Vec<KvEntry>) -> Result<(), String> {
    let key = op.key.as_str();
    let missing = || format!("key {key:?} doesn't exist");
    match op.verb {
        TxnVerb::Get => results.push(kv.get(key).ok_or_else(missing)?.clone()),
        TxnVerb::GetOrEmpty => results.push(kv.get(key).cloned().unwrap_or_else(|| KvEntry {
            key: key.to_owned(),
            create_index: 0,
            modify_index: 0,
            lock_index: 0,
            flags: 0,
            value: Vec::new(),
            session: None,
        })),
        TxnVerb::GetTree => results.extend(kv.list(key).cloned()),
        TxnVerb::CheckIndex => {
            let e = kv.get(key).ok_or_else(missing)?;
            if e.modify_index != op.index {
                return Err(format!(
                    "failed index check for key {key:?}, current modify index {} != {}",
                    e.modify_index, op.index
                ));
            }
            results.push(without_value(e));
        }
        TxnVerb::CheckSession => {
            let e = kv.get(key).ok_or_else(missing)?;
            let held = e.session.as_deref().unwrap_or("");
            if held != op.session {
                return Err(format!(
                    "failed session check for key {key:?}, current session {held:?} != {:?}",
                    op.session
                ));
            }
            results.push(without_value(e));
        }
        TxnVerb::CheckNotExists => {
            if kv.get(key).is_some() {
                return Err(format!("key {key:?} exists"));
            }
        }
        verb => return Err(format!("{verb:?} is not a read")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ClusterState;

    fn op(verb: TxnVerb, key: &str, value: &[u8], index: u64) -> TxnOp {
        TxnOp {
            verb,
            key: key.to_owned(),
            value: value.to_vec(),
            flags: 0,
            index,
            session: String::new(),
        }
    }

    #[test]
    fn all_or_nothing_with_op_index() {
        let mut st = ClusterState::new(2.0);
        let before = st.index;
        let err = st
            .txn(
                &[
                    op(TxnVerb::Set, "a", b"1", 0),
                    op(TxnVerb::Cas, "b", b"2", 99),
                ],
                Instant::now(),
            )
            .err()
            .unwrap_or_default();
        assert_eq!(err.len(), 1);
        assert_eq!(err[0].op_index, 1);
        assert!(st.kv.get("a").is_none(), "the set must be rolled back");
        assert_eq!(st.index, before);
    }

    #[test]
    fn writes_share_one_new_index_and_deletes_add_no_result() {
        let mut st = ClusterState::new(2.0);
        let results = st
            .txn(
                &[
                    op(TxnVerb::Set, "a", b"1", 0),
                    op(TxnVerb::Cas, "b", b"2", 0),
                    op(TxnVerb::Delete, "c", b"", 0),
                    op(TxnVerb::CheckNotExists, "c", b"", 0),
                ],
                Instant::now(),
            )
            .unwrap_or_default();
        assert_eq!(results.len(), 2);
        assert!(results.iter().all(|r| r.modify_index == st.index));
        assert!(results.iter().all(|r| r.value.is_empty()));
        let got = st
            .txn(&[op(TxnVerb::Get, "b", b"", 0)], Instant::now())
            .unwrap_or_default();
        assert_eq!(got.first().map(|e| e.value.clone()), Some(b"2".to_vec()));
    }
}
