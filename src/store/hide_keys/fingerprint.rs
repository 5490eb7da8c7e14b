//! The master key's fingerprint, stored with the hide keys (issue 32,
//! item 5): a node whose master key is not the one the keys are sealed
//! with refuses every key change and refuses to start, naming both
//! fingerprints, instead of sealing versions the other nodes cannot open.
//!
//! The fingerprint is HMAC-SHA256 under the master key of a fixed label,
//! cut to 8 bytes: it tells two master keys apart and, being a keyed
//! one-way function of a public message, tells nothing about the key.
//! It is written once, before the first key is made (or, for keys made
//! before fingerprints, by the first change from a node whose master key
//! opens every stored version), and never changed by idgen: whichever
//! node writes it first, every later change must come from the same
//! master key, so a check before each change cannot race a rewrite.
//!
//! - Embedded: key `hide_master_fingerprint` of the state file's `meta`
//!   table (a backup carries it; a restore keeps the backup's).
//! - Consul: `<prefix>/<cluster>/hide-master-fingerprint`, created with a
//!   compare-and-set on index 0, so of two nodes writing at once one wins
//!   and the other reads the winner's.

use ring::hmac;

use super::{unwrap_record, HideKeyError, HideKeys, MasterKey};
use crate::store::StoreError;

/// The label the fingerprint signs; a new label would be a new
/// fingerprint for every key, so it never changes.
const LABEL: &[u8] = b"idgen hide master key fingerprint v1";

/// The fingerprint's length in bytes (shown as twice as many hex digits).
const BYTES: usize = 8;

/// Where the embedded store keeps it, in the `meta` table.
pub(crate) const META_KEY: &str = "hide_master_fingerprint";

impl MasterKey {
    /// This key's fingerprint: 16 hex digits, the same on every node that
    /// holds the same key, and nothing that helps recover it.
    pub fn fingerprint(&self) -> String {
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &self.0), LABEL);
        tag.as_ref()[..BYTES]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Checks a stored fingerprint's form (`source` names where it was read).
pub(super) fn parse(source: &str, text: &str) -> Result<String, StoreError> {
    let text = text.trim();
    if text.len() == 2 * BYTES && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(text.to_ascii_lowercase())
    } else {
        Err(StoreError::Backend(format!(
            "the hide master key fingerprint in {source} is unreadable ({:?}); delete it and the next key change by a node whose master key opens every key writes it again",
            text.chars().take(40).collect::<String>()
        )))
    }
}

fn mismatch(stored: String, this_node: String) -> StoreError {
    StoreError::HideKey(HideKeyError::MasterMismatch { stored, this_node })
}

impl HideKeys {
    /// This node's master key, once it is known to be the one the stored
    /// keys are sealed with: the stored fingerprint equals its own, or, if
    /// none is stored yet, it opens every stored version and its
    /// fingerprint is then stored. Every key change calls this first.
    pub(super) async fn checked_master(&self) -> Result<std::sync::Arc<MasterKey>, StoreError> {
        let master = self.master()?;
        let mine = master.fingerprint();
        let stored = match self.records.master_fingerprint().await? {
            Some(stored) => stored,
            None => {
                // Keys made before fingerprints: only a master that opens
                // every one of them may record itself as theirs.
                let records = self.records.all().await?;
                if let Err(e) = records
                    .iter()
                    .try_for_each(|r| unwrap_record(&master, r).map(drop))
                {
                    // A node that wrote its fingerprint (and then a key)
                    // meanwhile is named, rather than the key.
                    return Err(match self.records.master_fingerprint().await? {
                        Some(stored) if stored != mine => mismatch(stored, mine),
                        _ => e,
                    });
                }
                let stored = self.records.claim_master_fingerprint(&mine).await?;
                if stored == mine {
                    tracing::info!(
                        fingerprint = %mine,
                        keys = records.len(),
                        "hide master key fingerprint recorded with the hide keys"
                    );
                }
                stored
            }
        };
        if stored != mine {
            return Err(mismatch(stored, mine));
        }
        Ok(master)
    }

    /// Refuses a master key whose fingerprint is not the stored one (start:
    /// the node then stops, naming both). Without a master key, or with no
    /// fingerprint stored yet, it passes: the rings' load still refuses a
    /// stored key that does not open.
    pub(super) async fn check_stored_fingerprint(&self) -> Result<(), StoreError> {
        let Some(master) = &self.master else {
            return Ok(());
        };
        let mine = master.fingerprint();
        tracing::info!(fingerprint = %mine, "hide master key fingerprint");
        match self.records.master_fingerprint().await? {
            Some(stored) if stored != mine => Err(mismatch(stored, mine)),
            _ => Ok(()),
        }
    }
}

/// Carries a backup's fingerprint into the state file a restore builds
/// (`to` has none of its own: restores make a new file).
pub(crate) fn copy_for_restore(
    from: &redb::ReadTransaction,
    to: &redb::WriteTransaction,
) -> Result<(), StoreError> {
    use crate::store::embedded::{backend_err, META};
    let meta = match from.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(backend_err(e)),
    };
    let Some(value) = meta.get(META_KEY).map_err(backend_err)? else {
        return Ok(());
    };
    let fingerprint = parse("the backup's meta table", value.value())?;
    let mut target = to.open_table(META).map_err(backend_err)?;
    target
        .insert(META_KEY, fingerprint.as_str())
        .map_err(backend_err)?;
    Ok(())
}
