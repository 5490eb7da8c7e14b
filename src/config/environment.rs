//! The `IDGEN_*` environment: every variable under the prefix must name a
//! config key (or be one of the few the CLI and scripts read), and a typo
//! is refused with the nearest valid name. And `${CREDENTIALS_DIRECTORY}`
//! in path keys, where systemd's `LoadCredential=` puts secrets.

use super::ConfigError;

/// `IDGEN_*` variables that are not config keys: read by the CLI (the
/// admin token of `idgen admin`) and by the test and bench scripts. Every
/// other `IDGEN_*` variable must name a key.
pub const NON_CONFIG_VARIABLES: &[&str] = &[
    "IDGEN_CONFIG",
    "IDGEN_ADMIN_TOKEN",
    "IDGEN_CHAOS_IDS",
    "IDGEN_BENCH_SECS",
    "IDGEN_BENCH_ROUNDS",
    "IDGEN_TEST_FAULT",
    "IDGEN_HIDE_MASTER_KEY",
];

/// Refuses an environment variable under `prefix` that maps to no key of
/// `keys` (`(section, key)`) or old name of `aliases`, naming the nearest
/// valid one. The file layer passes its keys in, so this file needs
/// nothing of it.
pub(crate) fn check_environment(
    prefix: &str,
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    keys: &[(String, String)],
    aliases: &[(&str, &str)],
) -> Result<(), ConfigError> {
    for (name, _) in vars {
        let Some(name) = name.to_str() else {
            let lossy = name.to_string_lossy().into_owned();
            if lossy.starts_with(prefix) {
                return Err(ConfigError::Environment {
                    name: lossy,
                    problem: "is not valid UTF-8; unset it".into(),
                });
            }
            continue;
        };
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        if NON_CONFIG_VARIABLES.contains(&name) && prefix == "IDGEN_" {
            continue;
        }
        let wanted = rest.to_ascii_lowercase();
        let known = keys
            .iter()
            .any(|(section, key)| wanted == format!("{section}__{key}"))
            || aliases.iter().any(|(old, _)| wanted == *old);
        if known {
            continue;
        }
        let nearest = keys
            .iter()
            .min_by_key(|(section, key)| edit_distance(&wanted, &format!("{section}__{key}")));
        let problem = match nearest {
            Some((section, key)) => format!(
                "maps to no config key; did you mean {prefix}{}__{} ({section}.{key})? \
                 Variables are {prefix}<SECTION>__<KEY>, with two underscores between section and key",
                section.to_ascii_uppercase(),
                key.to_ascii_uppercase()
            ),
            None => "maps to no config key".into(),
        };
        return Err(ConfigError::Environment {
            name: name.to_owned(),
            problem,
        });
    }
    Ok(())
}

/// Levenshtein distance, for "did you mean" suggestions (of environment
/// variables here, of the file's keys in `file.rs`).
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The one variable path keys may name: the directory where systemd puts
/// the unit's `LoadCredential=` files (readable by the service only, even
/// with `DynamicUser=yes`).
pub const CREDENTIALS_DIRECTORY: &str = "CREDENTIALS_DIRECTORY";

/// `path` (the value of config key `key`) with `${CREDENTIALS_DIRECTORY}`
/// or `$CREDENTIALS_DIRECTORY` replaced by that variable's value, read
/// with `lookup`. Any other `${NAME}` is refused (only this one is
/// expanded, and a literal `${` in a path is almost surely a mistake); a
/// bare `$` followed by another name stays as written. Errors name the key
/// and what to do when the variable is unset, empty or relative.
pub fn expand_path(
    key: &str,
    path: &std::path::Path,
    lookup: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<std::path::PathBuf, ConfigError> {
    let Some(text) = path.to_str().filter(|t| t.contains('$')) else {
        return Ok(path.to_path_buf());
    };
    let bad =
        |problem: String| ConfigError::Parse(format!("config key {key} = {text:?}: {problem}"));
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, tail) = if let Some(braced) = after.strip_prefix('{') {
            let Some(end) = braced.find('}') else {
                return Err(bad(
                    "an unclosed ${; write ${CREDENTIALS_DIRECTORY}/NAME".into()
                ));
            };
            let name = &braced[..end];
            if name != CREDENTIALS_DIRECTORY {
                return Err(bad(format!("${{{name}}} is not expanded; only ${{{CREDENTIALS_DIRECTORY}}} is (systemd's LoadCredential=), else give the path itself")));
            }
            (name, &braced[end + 1..])
        } else {
            let len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            if &after[..len] != CREDENTIALS_DIRECTORY {
                out.push('$');
                rest = after;
                continue;
            }
            (&after[..len], &after[len..])
        };
        let value = lookup(name).filter(|v| !v.is_empty()).ok_or_else(|| {
            bad(format!("{name} is not set: run under systemd with LoadCredential= or give an absolute path"))
        })?;
        let value = value
            .into_string()
            .map_err(|_| bad(format!("{name} is not valid UTF-8")))?;
        if !std::path::Path::new(&value).is_absolute() {
            return Err(bad(format!("{name} = {value:?} is not an absolute path (systemd sets an absolute one); give the path itself")));
        }
        out.push_str(value.trim_end_matches('/'));
        rest = tail;
    }
    out.push_str(rest);
    Ok(out.into())
}

#[cfg(test)]
mod expand_tests {
    use super::*;
    use std::ffi::OsString;
    use std::path::Path;

    fn creds(name: &str) -> Option<OsString> {
        (name == CREDENTIALS_DIRECTORY).then(|| "/run/credentials/idgen.service/".into())
    }

    #[test]
    fn credentials_directory_is_expanded_in_both_forms() {
        for written in [
            "${CREDENTIALS_DIRECTORY}/tls-key",
            "$CREDENTIALS_DIRECTORY/tls-key",
        ] {
            let got = expand_path("server.tls.key", Path::new(written), creds).unwrap();
            assert_eq!(
                got,
                Path::new("/run/credentials/idgen.service/tls-key"),
                "{written}"
            );
        }
        // Paths without the variable, and other bare `$` names, stay as written.
        for kept in [
            "/etc/idgen/key.pem",
            "/srv/$HOME/x",
            "/a/$CREDENTIALS_DIRECTORYX/y",
            "/a$",
        ] {
            let got = expand_path("server.tls.key", Path::new(kept), creds).unwrap();
            assert_eq!(got, Path::new(kept));
        }
    }

    #[test]
    fn an_unset_or_unusable_variable_is_refused_with_what_to_do() {
        let err = expand_path(
            "consul.token_file",
            Path::new("${CREDENTIALS_DIRECTORY}/t"),
            |_| None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("consul.token_file"), "{err}");
        assert!(
            err.contains("CREDENTIALS_DIRECTORY is not set: run under systemd with LoadCredential= or give an absolute path"),
            "{err}"
        );
        let empty = |_: &str| Some(OsString::new());
        assert!(expand_path("k", Path::new("$CREDENTIALS_DIRECTORY/t"), empty).is_err());
        let relative = |_: &str| Some(OsString::from("run/creds"));
        let err = expand_path("k", Path::new("$CREDENTIALS_DIRECTORY/t"), relative)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not an absolute path"), "{err}");
        for wrong in ["${STATE_DIRECTORY}/x", "${CREDENTIALS_DIRECTORY/x"] {
            let err = expand_path("k", Path::new(wrong), creds)
                .unwrap_err()
                .to_string();
            assert!(err.contains("CREDENTIALS_DIRECTORY"), "{wrong}: {err}");
        }
    }

    #[test]
    fn every_path_key_of_the_config_is_expanded() {
        let mut file = crate::config::FileConfig::default();
        let written = std::path::PathBuf::from("${CREDENTIALS_DIRECTORY}/f");
        file.server.tls.cert = written.clone();
        file.server.tls.key = written.clone();
        file.server.tls.client_ca = written.clone();
        file.store.path = written.clone();
        file.consul.ca_file = written.clone();
        file.consul.cert_file = written.clone();
        file.consul.key_file = written.clone();
        file.consul.token_file = written.clone();
        file.admin.token_file = written;
        file.expand_paths(creds).unwrap();
        let text = file.redacted_toml().unwrap();
        assert!(!text.contains("CREDENTIALS_DIRECTORY"), "{text}");
        assert_eq!(
            text.matches("/run/credentials/idgen.service/f").count(),
            9,
            "{text}"
        );
    }
}
