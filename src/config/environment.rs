//! The `IDGEN_*` environment: every variable under the prefix must name a
//! config key (or be one of the few the CLI and scripts read), and a typo
//! is refused with the nearest valid name.

use super::file::{FileConfig, KEY_ALIASES};
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

/// Refuses an environment variable under `prefix` that maps to no key,
/// naming the nearest valid one.
pub(crate) fn check_environment(
    prefix: &str,
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<(), ConfigError> {
    let keys = FileConfig::keys();
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
            || KEY_ALIASES.iter().any(|(old, _)| wanted == *old);
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

/// Levenshtein distance, for "did you mean" suggestions.
fn edit_distance(a: &str, b: &str) -> usize {
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
