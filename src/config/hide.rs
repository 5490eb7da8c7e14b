//! `[hide]`: where this node's hide master key comes from (issue 23). The
//! per-namespace hiding options live with each namespace's settings.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::ConfigError;
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
        self.validate_with(|name| std::env::var_os(name))
    }

    /// [`validate`](Self::validate) with the environment read by `lookup`:
    /// `${CREDENTIALS_DIRECTORY}` expands as in every other path key
    /// ([`crate::config::expand_path`]).
    pub fn validate_with(
        &self,
        lookup: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<HideSettings, ConfigError> {
        if self.master_key_file.as_os_str().is_empty() {
            return Ok(HideSettings::default());
        }
        let path = super::expand_path("hide.master_key_file", &self.master_key_file, lookup)?;
        Ok(HideSettings {
            master_key_file: Some(path),
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(name: &str) -> Option<std::ffi::OsString> {
        (name == "CREDENTIALS_DIRECTORY").then(|| "/run/credentials/idgen.service".into())
    }

    /// The master key file expands systemd's credentials directory exactly
    /// as the other path keys do: both spellings, and an unset or empty
    /// variable is an error naming the key (never a path relative to the
    /// working directory).
    #[test]
    fn the_master_key_file_expands_like_every_path_key() {
        let section = |p: &str| HideSection {
            master_key_file: p.into(),
        };
        for written in [
            "${CREDENTIALS_DIRECTORY}/hide-key",
            "$CREDENTIALS_DIRECTORY/hide-key",
        ] {
            let s = section(written).validate_with(creds).expect("expands");
            assert_eq!(
                s.master_key_file.as_deref(),
                Some(std::path::Path::new(
                    "/run/credentials/idgen.service/hide-key"
                )),
                "{written}"
            );
        }
        for lookup in [None, Some(std::ffi::OsString::new())] {
            let e = section("${CREDENTIALS_DIRECTORY}/hide-key")
                .validate_with(|_| lookup.clone())
                .expect_err("no credentials directory");
            assert!(e.to_string().contains("hide.master_key_file"), "{e}");
        }
        assert_eq!(
            section("")
                .validate_with(creds)
                .expect("unset")
                .master_key_file,
            None
        );
    }
}
