//! Hide keys (issue 23): the data keys hidden namespaces permute their IDs
//! with, stored wrapped where the namespace lives.
//!
//! Envelope encryption: each key version's 32 bytes (a data key, derived
//! from the master key, the key id and the version with HKDF-SHA256 on
//! `create`/`rotate`, so one version number always names one key) are sealed with
//! the node's [`MasterKey`] (AES-256-GCM, a random 96-bit nonce, the key id
//! and version as associated data, so a wrapped key cannot be moved to
//! another id or version) and only the sealed bytes are stored. One
//! [`StoredHideKey`] per key id holds every version ever made:
//!
//! - Embedded: table `hide_keys` (key id -> JSON) of the state file, one
//!   redb write transaction per change; carried by backups as stored.
//! - Consul: `<prefix>/<cluster>/hide-keys/<key_id>` holds the JSON,
//!   written through [`compare_and_set`](crate::store::cas::compare_and_set)
//!   on the ModifyIndex of a consistent read, so two admins rotating at
//!   once cannot both win.
//!
//! Why a version never repeats or goes back: a change is decided on the
//! record as read, in one transaction (embedded) or a `cas` on the read's
//! index (Consul); `rotate` adds `max(version) + 1`, never reusing a number;
//! no change removes a version, and a version's state only moves from
//! active to retired. Records are never deleted by idgen: IDs made with a
//! retired version must stay decodable.
//!
//! Why no node seals with another master key: the master key's fingerprint
//! is stored with the keys when the first one is made (`fingerprint.rs`),
//! and every change, and every start, is refused to a node whose own
//! fingerprint differs.

mod consul;
mod embedded;
mod fingerprint;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine as _;
use redb::TableDefinition;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::id::hide::{HideKey, KeyVersion};
use crate::id::ErrorKind;
use crate::store::StoreError;

pub use consul::ConsulHideKeyRecords;

pub(crate) const HIDE_KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("hide_keys");

/// The environment variable a master key may come from (base64 or hex).
pub const MASTER_KEY_ENV: &str = "IDGEN_HIDE_MASTER_KEY";

/// The largest key version a record holds.
pub const MAX_VERSION: KeyVersion = 255;

/// The state of one key version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HideKeyState {
    /// Issues new IDs (at most one version of a key id is active).
    Active,
    /// Decode-only: IDs made with it still decode; none are issued.
    Retired,
}

impl HideKeyState {
    /// The name shown to operators and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Retired => "retired",
        }
    }
}

/// One key version as listed: never its material.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HideKeyVersionInfo {
    /// The version (the number in the IDs' version field).
    pub version: KeyVersion,
    /// Active or retired.
    pub state: HideKeyState,
    /// When it was made, Unix ms.
    pub created_ms: u64,
}

/// One key id as listed: its versions, never their material.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HideKeyInfo {
    /// The key id namespaces name.
    pub key_id: String,
    /// Every version, oldest first.
    pub versions: Vec<HideKeyVersionInfo>,
}

impl HideKeyInfo {
    /// The active version, if any.
    pub fn active(&self) -> Option<KeyVersion> {
        self.versions
            .iter()
            .find(|v| v.state == HideKeyState::Active)
            .map(|v| v.version)
    }
}

/// A key id loaded and unwrapped: what issuers and decoders use.
pub struct HideKeyRing {
    /// The key id.
    pub key_id: String,
    /// The version new IDs are made with; `None` once the key is retired.
    pub active: Option<KeyVersion>,
    /// Every version, retired ones too (old IDs stay decodable), oldest
    /// first.
    pub keys: Vec<HideKey>,
}

impl fmt::Debug for HideKeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HideKeyRing")
            .field("key_id", &self.key_id)
            .field("active", &self.active)
            .field(
                "versions",
                &self.keys.iter().map(HideKey::version).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl HideKeyRing {
    /// The key of `version`, if the ring has it.
    pub fn key(&self, version: KeyVersion) -> Option<&HideKey> {
        self.keys.iter().find(|k| k.version() == version)
    }
}

/// One stored version: the data key sealed with the master key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredVersion {
    /// The version.
    pub version: KeyVersion,
    /// Active or retired.
    pub state: HideKeyState,
    /// When it was made, Unix ms.
    pub created_ms: u64,
    /// base64 of nonce (12 bytes) || AES-256-GCM ciphertext and tag.
    pub wrapped: String,
}

/// The stored record of one key id (what backups carry, sealed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredHideKey {
    /// The key id.
    pub key_id: String,
    /// Every version ever made, by version.
    pub versions: Vec<StoredVersion>,
}

impl StoredHideKey {
    /// What listing shows of it.
    pub fn info(&self) -> HideKeyInfo {
        HideKeyInfo {
            key_id: self.key_id.clone(),
            versions: self
                .versions
                .iter()
                .map(|v| HideKeyVersionInfo {
                    version: v.version,
                    state: v.state,
                    created_ms: v.created_ms,
                })
                .collect(),
        }
    }

    /// Merges `other` (a restored record of the same key id) into this
    /// one: every version of either is kept, and a version both hold keeps
    /// this record's material and the more retired of the two states; a
    /// restore never drops or re-activates a version. At most one version
    /// stays active (the highest active one).
    pub fn merge(&mut self, other: &StoredHideKey) {
        for theirs in &other.versions {
            match self
                .versions
                .iter_mut()
                .find(|v| v.version == theirs.version)
            {
                Some(ours) => ours.state = ours.state.max(theirs.state),
                None => self.versions.push(theirs.clone()),
            }
        }
        self.versions.sort_by_key(|v| v.version);
        let active: Vec<KeyVersion> = self
            .versions
            .iter()
            .filter(|v| v.state == HideKeyState::Active)
            .map(|v| v.version)
            .collect();
        if let Some((&keep, _)) = active.split_last() {
            for v in &mut self.versions {
                if v.state == HideKeyState::Active && v.version != keep {
                    v.state = HideKeyState::Retired;
                }
            }
        }
    }
}

/// Why a hide key operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HideKeyError {
    /// The key id is not `[a-z0-9][a-z0-9_-]{0,62}`.
    #[error("hide key id {0:?} is invalid: use 1 to 63 characters of a-z, 0-9, '_' and '-', starting with a letter or digit")]
    InvalidKeyId(String),
    /// No record under that key id.
    #[error("hide key {0} does not exist; create it with `idgen admin keys create {0}`")]
    NotFound(String),
    /// `create` of a key id that exists.
    #[error("hide key {0} already exists; rotate it with `idgen admin keys rotate {0}` to make a new version")]
    Exists(String),
    /// No master key on this node.
    #[error("no hide master key is configured on this node: set hide.master_key_file or IDGEN_HIDE_MASTER_KEY (32 bytes, base64 or hex)")]
    NoMasterKey,
    /// Every version number is used.
    #[error("hide key {0} has used every version up to {MAX_VERSION}; create a new key id and point the namespaces at it")]
    VersionsUsedUp(String),
    /// A rotation would make a version a namespace using the key cannot
    /// hold (`idgen admin keys rotate --force` skips this check).
    #[error("rotating hide key {key_id} would make version {next}, and {holders} cannot hold it, so it would refuse to issue for good (versions only go up); point it at a new key id (create one with `idgen admin keys create NEW_KEY`), or rotate anyway with `idgen admin keys rotate --force {key_id}` (RotateHideKey force = true)")]
    PastNarrowField {
        /// The key id.
        key_id: String,
        /// The version the rotation would have made.
        next: KeyVersion,
        /// The namespaces that cannot hold it, each with its field and
        /// the versions it holds.
        holders: String,
    },
    /// A stored version does not open with this node's master key.
    #[error("hide key {key_id} version {version} cannot be unwrapped with this node's master key: every node must use the same master key (hide.master_key_file or IDGEN_HIDE_MASTER_KEY); fix the key and restart")]
    WrongMasterKey {
        /// The key id.
        key_id: String,
        /// The version that did not open.
        version: KeyVersion,
    },
    /// This node's master key is not the one the stored keys are sealed
    /// with: its fingerprint differs from the one stored with them.
    #[error("this node's hide master key has fingerprint {this_node}, but the hide keys stored here were sealed with the master key of fingerprint {stored} (recorded with them), so nothing it seals would open on the other nodes: give this node the master key whose fingerprint is {stored} (each node logs its own at start, \"hide master key fingerprint\") in hide.master_key_file or IDGEN_HIDE_MASTER_KEY, and restart it; no key was changed")]
    MasterMismatch {
        /// The fingerprint stored with the keys.
        stored: String,
        /// This node's own.
        this_node: String,
    },
    /// A master key that is not 32 bytes or cannot be read.
    #[error("hide master key {source_name}: {detail}")]
    BadMasterKey {
        /// Where it came from (a file path or the environment variable).
        source_name: String,
        /// What is wrong, and what to do.
        detail: String,
    },
}

impl HideKeyError {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidKeyId(_) => ErrorKind::BadRequest,
            Self::NotFound(_) => ErrorKind::NotFound,
            Self::Exists(_) => ErrorKind::AlreadyExists,
            Self::VersionsUsedUp(_) => ErrorKind::Exhausted,
            Self::PastNarrowField { .. }
            | Self::NoMasterKey
            | Self::WrongMasterKey { .. }
            | Self::MasterMismatch { .. }
            | Self::BadMasterKey { .. } => ErrorKind::Precondition,
        }
    }
}

/// Checks a key id's syntax: `[a-z0-9][a-z0-9_-]{0,62}`.
pub fn check_key_id(key_id: &str) -> Result<(), HideKeyError> {
    let bytes = key_id.as_bytes();
    let ok = (1..=63).contains(&bytes.len())
        && bytes[0].is_ascii_lowercase() | bytes[0].is_ascii_digit()
        && bytes
            .iter()
            .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(HideKeyError::InvalidKeyId(
            key_id.chars().take(80).collect(),
        ))
    }
}

/// The 32-byte key that seals data keys. Never printed (its `Debug` says
/// nothing of it), zeroed on drop.
pub struct MasterKey([u8; 32]);

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

impl Drop for MasterKey {
    fn drop(&mut self) {
        for b in self.0.iter_mut() {
            // SAFETY: `b` is a valid, aligned &mut u8.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

impl MasterKey {
    /// A master key from its 32 bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Parses base64 (standard, padded or not) or hex text of 32 bytes;
    /// surrounding whitespace is ignored. `source_name` names where it
    /// came from in errors.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, HideKeyError> {
        let text = text.trim();
        let bad = |detail: String| HideKeyError::BadMasterKey {
            source_name: source_name.to_owned(),
            detail,
        };
        let bytes = if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            (0..32)
                .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16))
                .collect::<Result<Vec<u8>, _>>()
                .map_err(|e| bad(format!("not hex ({e})")))?
        } else {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(text))
                .map_err(|_| {
                    bad("is neither 64 hex digits nor base64; make one with `head -c 32 /dev/urandom | base64`".to_owned())
                })?
        };
        let len = bytes.len();
        let mut out = [0u8; 32];
        if len != 32 {
            return Err(bad(format!(
                "is {len} bytes, a master key is exactly 32; make one with `head -c 32 /dev/urandom | base64`"
            )));
        }
        out.copy_from_slice(&bytes);
        Ok(Self(out))
    }

    /// Reads a master key file (base64 or hex text, or exactly 32 raw
    /// bytes). Also returns a warning when others can read the file.
    pub fn from_file(path: &Path) -> Result<(Self, Option<String>), HideKeyError> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| HideKeyError::BadMasterKey {
            source_name: name.clone(),
            detail: format!("cannot be read ({e}); check hide.master_key_file"),
        })?;
        let key = match <[u8; 32]>::try_from(bytes.as_slice()) {
            Ok(raw)
                if std::str::from_utf8(&raw).map_or(true, |s| Self::parse(s, &name).is_err()) =>
            {
                Self(raw)
            }
            _ => Self::parse(&String::from_utf8_lossy(&bytes), &name)?,
        };
        Ok((key, world_readable_warning(path)))
    }

    fn aead(&self) -> Result<LessSafeKey, StoreError> {
        UnboundKey::new(&AES_256_GCM, &self.0)
            .map(LessSafeKey::new)
            .map_err(|_| StoreError::Backend("AES-256-GCM key setup failed".to_owned()))
    }

    /// The data key of `key_id` version `version`: HKDF-SHA256 of the
    /// master key over the key id and version. Derived, not drawn at
    /// random, so a version number can only ever name one key: if a record
    /// goes back (a Consul snapshot restored over the cluster, an operator
    /// writing an old record) and a later rotate makes the same version
    /// number again, it is the same key, and IDs it shows cannot collide
    /// with the ones the lost record's version showed (the same permutation
    /// of internal values that never repeat). Independent per version
    /// (HKDF outputs), so a leaked data key reveals no other.
    pub fn derive(&self, key_id: &str, version: KeyVersion) -> Result<[u8; 32], StoreError> {
        use ring::hkdf;
        let failed = || StoreError::Backend("deriving a hide key failed".to_owned());
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"idgen hide data key").extract(&self.0);
        let info = aad(key_id, version);
        let info = [info.as_slice()];
        let okm = prk.expand(&info, hkdf::HKDF_SHA256).map_err(|_| failed())?;
        let mut out = [0u8; 32];
        okm.fill(&mut out).map_err(|_| failed())?;
        Ok(out)
    }

    /// Seals `material` for `key_id` version `version`.
    pub fn wrap(
        &self,
        key_id: &str,
        version: KeyVersion,
        material: &[u8; 32],
    ) -> Result<String, StoreError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| StoreError::Backend("the system random source failed".to_owned()))?;
        let mut sealed = material.to_vec();
        self.aead()?
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(key_id, version)),
                &mut sealed,
            )
            .map_err(|_| StoreError::Backend("sealing a hide key failed".to_owned()))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(base64::engine::general_purpose::STANDARD.encode(out))
    }

    /// Opens a version sealed by [`wrap`](Self::wrap).
    pub fn unwrap_key(&self, key_id: &str, stored: &StoredVersion) -> Result<HideKey, StoreError> {
        let wrong = || {
            StoreError::HideKey(HideKeyError::WrongMasterKey {
                key_id: key_id.to_owned(),
                version: stored.version,
            })
        };
        let mut bytes = base64::engine::general_purpose::STANDARD
            .decode(&stored.wrapped)
            .map_err(|_| wrong())?;
        if bytes.len() != NONCE_LEN + 32 + AES_256_GCM.tag_len() {
            return Err(wrong());
        }
        let (nonce, sealed) = bytes.split_at_mut(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| wrong())?;
        let plain = self
            .aead()?
            .open_in_place(nonce, Aad::from(aad(key_id, stored.version)), sealed)
            .map_err(|_| wrong())?;
        let mut material = [0u8; 32];
        material.copy_from_slice(plain);
        let key = HideKey::new(stored.version, material);
        for b in bytes.iter_mut().chain(material.iter_mut()) {
            // SAFETY: valid, aligned &mut u8.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
        Ok(key)
    }
}

fn aad(key_id: &str, version: KeyVersion) -> Vec<u8> {
    format!("idgen-hide-key/{key_id}/{version}").into_bytes()
}

#[cfg(unix)]
fn world_readable_warning(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    (mode & 0o004 != 0).then(|| {
        format!(
            "hide master key file {} is readable by every user (mode {:o}); run `chmod 600 {}`",
            path.display(),
            mode & 0o777,
            path.display()
        )
    })
}

#[cfg(not(unix))]
fn world_readable_warning(_: &Path) -> Option<String> {
    None
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn decode(key: &str, bytes: &[u8]) -> Result<StoredHideKey, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| {
        StoreError::Backend(format!(
            "hide key record {key} is unreadable ({e}); restore it from a backup"
        ))
    })
}

fn encode(record: &StoredHideKey) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(record).map_err(|e| StoreError::Backend(format!("hide key record: {e}")))
}

/// A change to one key record, decided on the record as read (`None`:
/// absent); it may run more than once when Consul writes race.
pub type KeyChange =
    Arc<dyn Fn(Option<&StoredHideKey>) -> Result<StoredHideKey, StoreError> + Send + Sync>;

/// Where key records live (one impl per backend). Records only: sealing
/// and the rules of a change are [`HideKeys`]'.
#[async_trait]
pub trait HideKeyRecords: Send + Sync + 'static {
    /// Every record, by key id (strongest consistency the backend offers).
    async fn all(&self) -> Result<Vec<StoredHideKey>, StoreError>;

    /// One record; `None` if never stored.
    async fn get(&self, key_id: &str) -> Result<Option<StoredHideKey>, StoreError>;

    /// Writes what `change` decides from the record as read, atomically
    /// with that read (a transaction, or a `cas` on its index).
    async fn change(&self, key_id: &str, change: KeyChange) -> Result<StoredHideKey, StoreError>;

    /// Waits until the records may have changed since `index` (Consul: a
    /// blocking query; embedded: `wait` passes, as only this process
    /// writes them) and returns the index to wait on next.
    async fn wait_change(&self, index: u64, wait: std::time::Duration) -> Result<u64, StoreError>;

    /// The fingerprint of the master key the records are sealed with, as
    /// stored beside them (`None`: never written; see `fingerprint.rs`).
    async fn master_fingerprint(&self) -> Result<Option<String>, StoreError>;

    /// Stores `fingerprint` unless one is stored already, atomically with
    /// that check; returns the one stored afterwards (this one, or the one
    /// another node wrote first).
    async fn claim_master_fingerprint(&self, fingerprint: &str) -> Result<String, StoreError>;
}

/// The hide key operations, as the admin API and issuers see them.
#[async_trait]
pub trait HideKeyStore: Send + Sync + 'static {
    /// Whether this node holds the master key the keys are sealed with
    /// (without it, no key unwraps and no hidden namespace issues).
    fn has_master(&self) -> bool {
        true
    }

    /// Refuses (at start) a master key whose fingerprint is not the one
    /// stored with the keys, naming both.
    async fn check_master(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Makes key id `key_id` with version 0 active.
    async fn create(&self, key_id: &str) -> Result<HideKeyInfo, StoreError>;
    /// Adds version `max + 1` as active and retires the previous active.
    async fn rotate(&self, key_id: &str) -> Result<HideKeyInfo, StoreError> {
        self.rotate_within(key_id, None).await
    }
    /// [`rotate`](Self::rotate), refused when `max + 1` is above `limit`
    /// (decided on the record as read, in the same atomic change).
    async fn rotate_within(
        &self,
        key_id: &str,
        limit: Option<VersionLimit>,
    ) -> Result<HideKeyInfo, StoreError>;
    /// Retires the active version without a successor (decode-only).
    async fn retire(&self, key_id: &str) -> Result<HideKeyInfo, StoreError>;
    /// Every key id and its versions (never material).
    async fn list(&self) -> Result<Vec<HideKeyInfo>, StoreError>;
    /// One key id, unwrapped; `None` if it does not exist.
    async fn ring(&self, key_id: &str) -> Result<Option<HideKeyRing>, StoreError>;
    /// Every key id, unwrapped, with the (version, state) pairs it was
    /// made from (what [`crate::modes::hide_keys`] publishes).
    async fn rings(&self) -> Result<Vec<LoadedRing>, StoreError>;
    /// Waits for a possible change after `index` (see
    /// [`HideKeyRecords::wait_change`]).
    async fn wait_change(&self, index: u64, wait: std::time::Duration) -> Result<u64, StoreError>;
}

/// One key id as loaded by [`HideKeyStore::rings`].
#[derive(Debug)]
pub struct LoadedRing {
    /// The key id.
    pub key_id: String,
    /// Every version and its state, by version.
    pub states: Vec<(KeyVersion, HideKeyState)>,
    /// The unwrapped ring.
    pub ring: HideKeyRing,
}

/// [`HideKeyStore`] over a backend's records and this node's master key.
#[derive(Clone)]
pub struct HideKeys {
    records: Arc<dyn HideKeyRecords>,
    master: Option<Arc<MasterKey>>,
}

impl fmt::Debug for HideKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HideKeys")
            .field("master_key", &self.master.is_some())
            .finish()
    }
}

impl HideKeys {
    /// Keys in `records`, sealed with `master` (`None`: every operation
    /// that needs material is refused with [`HideKeyError::NoMasterKey`]).
    pub fn new(records: Arc<dyn HideKeyRecords>, master: Option<Arc<MasterKey>>) -> Self {
        Self { records, master }
    }

    /// The records (backups, restores).
    pub fn records(&self) -> &Arc<dyn HideKeyRecords> {
        &self.records
    }

    fn master(&self) -> Result<Arc<MasterKey>, StoreError> {
        self.master
            .clone()
            .ok_or(StoreError::HideKey(HideKeyError::NoMasterKey))
    }

    /// A new version `version` of `key_id`, sealed.
    fn new_version(
        master: &MasterKey,
        key_id: &str,
        version: KeyVersion,
    ) -> Result<StoredVersion, StoreError> {
        let mut material = master.derive(key_id, version)?;
        let wrapped = master.wrap(key_id, version, &material);
        for b in material.iter_mut() {
            // SAFETY: valid, aligned &mut u8.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
        Ok(StoredVersion {
            version,
            state: HideKeyState::Active,
            created_ms: now_ms(),
            wrapped: wrapped?,
        })
    }
}

fn unwrap_record(master: &MasterKey, record: &StoredHideKey) -> Result<HideKeyRing, StoreError> {
    let keys = record
        .versions
        .iter()
        .map(|v| master.unwrap_key(&record.key_id, v))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HideKeyRing {
        key_id: record.key_id.clone(),
        active: record.info().active(),
        keys,
    })
}

/// Merges the `hide_keys` table of a backup (`from`) into a state file's
/// (`to`), record by record with [`StoredHideKey::merge`]: a version either
/// holds is kept, its state the more retired of the two. The backup's
/// master key fingerprint comes along.
pub(crate) fn merge_table(
    from: &redb::ReadTransaction,
    to: &redb::WriteTransaction,
) -> Result<usize, StoreError> {
    use crate::store::embedded::backend_err;
    use redb::ReadableTable;
    fingerprint::copy_for_restore(from, to)?;
    let source = match from.open_table(HIDE_KEYS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(backend_err(e)),
    };
    let mut target = to.open_table(HIDE_KEYS).map_err(backend_err)?;
    let mut merged = 0;
    for item in source.iter().map_err(backend_err)? {
        let (k, v) = item.map_err(backend_err)?;
        let theirs = decode(k.value(), v.value())?;
        let existing = match target.get(k.value()).map_err(backend_err)? {
            Some(ours) => Some(decode(k.value(), ours.value())?),
            None => None,
        };
        let record = match existing {
            Some(mut ours) => {
                ours.merge(&theirs);
                ours
            }
            None => theirs,
        };
        target
            .insert(k.value(), encode(&record)?.as_slice())
            .map_err(backend_err)?;
        merged += 1;
    }
    Ok(merged)
}

fn not_found(key_id: &str) -> StoreError {
    StoreError::HideKey(HideKeyError::NotFound(key_id.to_owned()))
}

/// The largest version the namespaces using a key can hold, and which
/// they are: a rotation past it is refused
/// ([`HideKeyError::PastNarrowField`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionLimit {
    /// The largest version every one of them holds.
    pub max: KeyVersion,
    /// The namespaces whose fields hold at most `max`, with their fields,
    /// as a refusal names them.
    pub holders: String,
}

/// `record` rotated: a new active version above every existing one, the
/// previous active retired; refused when the new version is above
/// `limit`.
fn rotated(
    master: &MasterKey,
    record: &StoredHideKey,
    limit: Option<&VersionLimit>,
) -> Result<StoredHideKey, StoreError> {
    let top = record.versions.iter().map(|v| v.version).max();
    let next = match top {
        None => 0,
        Some(MAX_VERSION) => {
            return Err(StoreError::HideKey(HideKeyError::VersionsUsedUp(
                record.key_id.clone(),
            )))
        }
        Some(v) => v + 1,
    };
    if let Some(limit) = limit.filter(|l| next > l.max) {
        return Err(StoreError::HideKey(HideKeyError::PastNarrowField {
            key_id: record.key_id.clone(),
            next,
            holders: limit.holders.clone(),
        }));
    }
    let mut out = record.clone();
    for v in &mut out.versions {
        v.state = HideKeyState::Retired;
    }
    out.versions
        .push(HideKeys::new_version(master, &record.key_id, next)?);
    Ok(out)
}

#[async_trait]
impl HideKeyStore for HideKeys {
    fn has_master(&self) -> bool {
        self.master.is_some()
    }

    async fn check_master(&self) -> Result<(), StoreError> {
        self.check_stored_fingerprint().await
    }

    async fn create(&self, key_id: &str) -> Result<HideKeyInfo, StoreError> {
        check_key_id(key_id)?;
        let master = self.checked_master().await?;
        let id = key_id.to_owned();
        let change: KeyChange = Arc::new(move |existing| match existing {
            Some(_) => Err(StoreError::HideKey(HideKeyError::Exists(id.clone()))),
            None => Ok(StoredHideKey {
                key_id: id.clone(),
                versions: vec![HideKeys::new_version(&master, &id, 0)?],
            }),
        });
        Ok(self.records.change(key_id, change).await?.info())
    }

    async fn rotate_within(
        &self,
        key_id: &str,
        limit: Option<VersionLimit>,
    ) -> Result<HideKeyInfo, StoreError> {
        check_key_id(key_id)?;
        let master = self.checked_master().await?;
        let id = key_id.to_owned();
        let change: KeyChange = Arc::new(move |existing| match existing {
            None => Err(not_found(&id)),
            Some(r) => rotated(&master, r, limit.as_ref()),
        });
        Ok(self.records.change(key_id, change).await?.info())
    }

    async fn retire(&self, key_id: &str) -> Result<HideKeyInfo, StoreError> {
        check_key_id(key_id)?;
        // Retiring seals nothing, so a node without a master key may do it;
        // one with a master key that is not the keys' may not.
        if self.master.is_some() {
            self.checked_master().await?;
        }
        let id = key_id.to_owned();
        let change: KeyChange = Arc::new(move |existing| {
            let mut r = existing.cloned().ok_or_else(|| not_found(&id))?;
            for v in &mut r.versions {
                v.state = HideKeyState::Retired;
            }
            Ok(r)
        });
        Ok(self.records.change(key_id, change).await?.info())
    }

    async fn list(&self) -> Result<Vec<HideKeyInfo>, StoreError> {
        let mut all: Vec<HideKeyInfo> = self
            .records
            .all()
            .await?
            .iter()
            .map(StoredHideKey::info)
            .collect();
        all.sort_by(|a, b| a.key_id.cmp(&b.key_id));
        Ok(all)
    }

    async fn ring(&self, key_id: &str) -> Result<Option<HideKeyRing>, StoreError> {
        check_key_id(key_id)?;
        let Some(record) = self.records.get(key_id).await? else {
            return Ok(None);
        };
        Ok(Some(unwrap_record(&*self.master()?, &record)?))
    }

    async fn rings(&self) -> Result<Vec<LoadedRing>, StoreError> {
        let records = self.records.all().await?;
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let master = self.master()?;
        records
            .iter()
            .map(|r| {
                Ok(LoadedRing {
                    key_id: r.key_id.clone(),
                    states: r.versions.iter().map(|v| (v.version, v.state)).collect(),
                    ring: unwrap_record(&master, r)?,
                })
            })
            .collect()
    }

    async fn wait_change(&self, index: u64, wait: std::time::Duration) -> Result<u64, StoreError> {
        self.records.wait_change(index, wait).await
    }
}
