//! `PUT /v1/txn`: KV operations applied all-or-nothing under one index.

use std::time::Instant;

use super::kv::{validate_key, KvEntry};
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
            let outcome: Result<(), String> = match op.verb {
                TxnVerb::Set => {
                    changed |= kv.set(idx, key, op.value.clone(), op.flags);
                    results.extend(kv.get(key).map(without_value));
                    Ok(())
                }
                TxnVerb::Cas => match kv.cas(idx, key, op.value.clone(), op.flags, op.index) {
                    Some(c) => {
                        changed |= c;
                        results.extend(kv.get(key).map(without_value));
                        Ok(())
                    }
                    None => Err(format!("failed to set key {key:?}, index is stale")),
                },
                TxnVerb::Lock => {
                    if !self.sessions.contains_key(&op.session) {
                        Err(format!("invalid session {:?}", op.session))
                    } else if kv.in_lock_delay(key, now) {
                        Err(format!("failed to lock key {key:?} due to lock delay"))
                    } else {
                        match kv.lock(idx, key, op.value.clone(), op.flags, &op.session) {
                            Some(c) => {
                                changed |= c;
                                results.extend(kv.get(key).map(without_value));
                                Ok(())
                            }
                            None => Err(format!("failed to lock key {key:?}, lock is already held")),
                        }
                    }
                }
                TxnVerb::Unlock => match kv.unlock(idx, key, op.value.clone(), op.flags, &op.session) {
                    Some(c) => {
                        changed |= c;
                        results.extend(kv.get(key).map(without_value));
                        Ok(())
                    }
                    None => Err(format!(
                        "failed to unlock key {key:?}, lock isn't held, or is held by another session"
                    )),
                },
                TxnVerb::Get => match kv.get(key) {
                    Some(e) => {
                        results.push(e.clone());
                        Ok(())
                    }
                    None => Err(format!("key {key:?} doesn't exist")),
                },
                TxnVerb::GetOrEmpty => {
                    results.push(kv.get(key).cloned().unwrap_or_else(|| KvEntry {
                        key: key.to_owned(),
                        create_index: 0,
                        modify_index: 0,
                        lock_index: 0,
                        flags: 0,
                        value: Vec::new(),
                        session: None,
                    }));
                    Ok(())
                }
                TxnVerb::GetTree => {
                    results.extend(kv.list(key).cloned());
                    Ok(())
                }
                TxnVerb::CheckIndex => match kv.get(key) {
                    Some(e) if e.modify_index == op.index => {
                        results.push(without_value(e));
                        Ok(())
                    }
                    Some(e) => Err(format!(
                        "failed index check for key {key:?}, current modify index {} != {}",
                        e.modify_index, op.index
                    )),
                    None => Err(format!("key {key:?} doesn't exist")),
                },
                TxnVerb::CheckSession => match kv.get(key) {
                    Some(e) if e.session.as_deref().unwrap_or("") == op.session => {
                        results.push(without_value(e));
                        Ok(())
                    }
                    Some(e) => Err(format!(
                        "failed session check for key {key:?}, current session {:?} != {:?}",
                        e.session.as_deref().unwrap_or(""),
                        op.session
                    )),
                    None => Err(format!("key {key:?} doesn't exist")),
                },
                TxnVerb::CheckNotExists => match kv.get(key) {
                    Some(_) => Err(format!("key {key:?} exists")),
                    None => Ok(()),
                },
                TxnVerb::Delete => {
                    changed |= kv.delete(idx, key);
                    Ok(())
                }
                TxnVerb::DeleteTree => {
                    changed |= kv.delete_tree(idx, key);
                    Ok(())
                }
                TxnVerb::DeleteCas => match kv.delete_cas(idx, key, op.index) {
                    Some(c) => {
                        changed |= c;
                        Ok(())
                    }
                    None => Err(format!("failed to delete key {key:?}, index is stale")),
                },
            };
            if let Err(what) = outcome {
                errors.push(fail(what));
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
