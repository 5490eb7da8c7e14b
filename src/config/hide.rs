//! `[hide]`: where this node's hide master key comes from (issue 23). The
//! per-namespace hiding options live with each namespace's settings.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{invalid, ConfigError};
use crate::store::hide_keys::{HideKeyError, MasterKey, MASTER_KEY_ENV};

/// `[hide]` as written in the file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HideSection {
    /// A file holding the 32-byte master key that seals hide keys (base64,
    /// hex, or 32 raw bytes; `${CREDENTIALS_DIRECTORY}/...` works). Empty:
    /// the environment variable `IDGEN_HIDE_MASTER_KEY`, else none. Never
    /// put the key itself in the config.
    pub master_key_file: PathBuf,
}

/// The validated `[hide]` section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HideSettings {
    /// `hide.master_key_file`, if set.
    pub master_key_file: Option<PathBuf>,
}

impl HideSection {
    /// Validates the section (the file itself is read by
    /// [`HideSettings::master_key`]).
    pub fn validate(&self) -> Result<HideSettings, ConfigError> {
        if self.master_key_file.as_os_str().is_empty() {
            return Ok(HideSettings::default());
        }
        let path = expand_credentials(&self.master_key_file)?;
        Ok(HideSettings {
            master_key_file: Some(path),
        })
    }
}

/// `${CREDENTIALS_DIRECTORY}` at the start of a path, from systemd.
fn expand_credentials(path: &std::path::Path) -> Result<PathBuf, ConfigError> {
    const VAR: &str = "${CREDENTIALS_DIRECTORY}";
    let text = path.to_string_lossy();
    let Some(rest) = text.strip_prefix(VAR) else {
        return Ok(path.to_path_buf());
    };
    match std::env::var_os("CREDENTIALS_DIRECTORY") {
        Some(dir) => Ok(PathBuf::from(dir).join(rest.trim_start_matches('/'))),
        None => Err(invalid(
            "hide.master_key_file",
            "starts with ${CREDENTIALS_DIRECTORY} but that variable is not set: run under systemd with LoadCredential=, or give the full path",
        )),
    }
}

/// A master key as loaded, and a warning to log (a file others can read).
pub type LoadedMasterKey = (Arc<MasterKey>, Option<String>);

impl HideSettings {
    /// Loads the master key: `hide.master_key_file` if set, else
    /// `IDGEN_HIDE_MASTER_KEY`, else `None`. Wrong length, unreadable
    /// file, bad encoding: a clear error.
    pub fn master_key(&self) -> Result<Option<LoadedMasterKey>, HideKeyError> {
        self.master_key_from(std::env::var(MASTER_KEY_ENV).ok())
    }

    /// [`master_key`](Self::master_key) with the environment's value given.
    pub fn master_key_from(
        &self,
        env: Option<String>,
    ) -> Result<Option<LoadedMasterKey>, HideKeyError> {
        if let Some(path) = &self.master_key_file {
            let (key, warning) = MasterKey::from_file(path)?;
            return Ok(Some((Arc::new(key), warning)));
        }
        match env {
            Some(text) if !text.trim().is_empty() => {
                let key = MasterKey::parse(&text, MASTER_KEY_ENV)?;
                Ok(Some((Arc::new(key), None)))
            }
            _ => Ok(None),
        }
    }
}
