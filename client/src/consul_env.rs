//! Consul's own environment variables, read once, with the consul CLI's
//! rules: `CONSUL_HTTP_ADDR`, `CONSUL_HTTP_SSL`, `CONSUL_HTTP_TOKEN`,
//! `CONSUL_HTTP_TOKEN_FILE`, `CONSUL_CACERT`, `CONSUL_CLIENT_CERT`,
//! `CONSUL_CLIENT_KEY`, `CONSUL_TLS_SERVER_NAME` and
//! `CONSUL_HTTP_SSL_VERIFY`.
//!
//! The rules follow Consul's Go API client (`api/api.go` in
//! hashicorp/consul: `defaultConfig`, `NewClient`, `SetupTLSConfig`):
//! - the address defaults to `127.0.0.1:8500`; `CONSUL_HTTP_ADDR` replaces
//!   it, with or without a scheme; `https://` means HTTPS, and so does
//!   `CONSUL_HTTP_SSL=true` (which an `http://` in the variable does not
//!   undo: "never revert to http if TLS was explicitly requested");
//! - a non-empty `CONSUL_HTTP_TOKEN_FILE` wins over `CONSUL_HTTP_TOKEN`
//!   (its content, trimmed; an empty file falls back to the token);
//! - `CONSUL_TLS_SERVER_NAME` loses a `:port` suffix;
//! - `CONSUL_HTTP_SSL_VERIFY=false` turns certificate checks off.
//!
//! Precedence, as for the consul CLI: settings given explicitly (builder
//! methods, command-line flags) > these variables > defaults. One
//! difference: Consul only warns about a boolean it cannot parse (and an
//! unparsable `CONSUL_HTTP_SSL_VERIFY` then turns checks OFF); here it is
//! an error naming the variable.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::discovery::ConsulTls;

/// The agent address when nothing names one (Consul's default).
pub const DEFAULT_CONSUL_ADDR: &str = "http://127.0.0.1:8500";

/// Consul's client environment variables, as read at one moment.
///
/// [`ConsulEnv::from_env`] reads the process environment;
/// [`ConsulEnv::from_vars`] takes any list of variables (tests, or
/// settings from a config file). Empty values count as unset, as in Consul.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConsulEnv {
    /// `CONSUL_HTTP_ADDR`: `host:port`, `http://host:port` or
    /// `https://host:port`.
    pub http_addr: Option<String>,
    /// `CONSUL_HTTP_SSL`: HTTPS even for an address without a scheme.
    pub http_ssl: Option<String>,
    /// `CONSUL_HTTP_TOKEN`: the ACL token, sent as `X-Consul-Token`.
    pub token: Option<String>,
    /// `CONSUL_HTTP_TOKEN_FILE`: a file holding the ACL token; wins over
    /// `CONSUL_HTTP_TOKEN` when it holds one.
    pub token_file: Option<PathBuf>,
    /// `CONSUL_CACERT`: the CA (PEM) that signed the agent's certificate.
    pub cacert: Option<PathBuf>,
    /// `CONSUL_CLIENT_CERT`: a client certificate (PEM) for an agent with
    /// `verify_incoming`.
    pub client_cert: Option<PathBuf>,
    /// `CONSUL_CLIENT_KEY`: the private key (PEM) of `client_cert`.
    pub client_key: Option<PathBuf>,
    /// `CONSUL_TLS_SERVER_NAME`: the name the agent's certificate must
    /// carry when it is not the address's host.
    pub tls_server_name: Option<String>,
    /// `CONSUL_HTTP_SSL_VERIFY`: `false` turns certificate checks off.
    pub ssl_verify: Option<String>,
}

impl ConsulEnv {
    /// The process environment, read now.
    pub fn from_env() -> Self {
        Self::from_vars(std::env::vars_os())
    }

    /// From `(name, value)` pairs; names other than Consul's are ignored,
    /// and so are empty values and values that are not UTF-8 (paths may
    /// be any bytes).
    pub fn from_vars<K, V>(vars: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<OsString>,
        V: Into<OsString>,
    {
        let mut env = Self::default();
        for (name, value) in vars {
            let (name, value): (OsString, OsString) = (name.into(), value.into());
            if value.is_empty() {
                continue;
            }
            let text = || value.to_str().map(str::to_owned);
            let path = || Some(PathBuf::from(&value));
            match name.to_str() {
                Some("CONSUL_HTTP_ADDR") => env.http_addr = text(),
                Some("CONSUL_HTTP_SSL") => env.http_ssl = text(),
                Some("CONSUL_HTTP_TOKEN") => env.token = text(),
                Some("CONSUL_HTTP_TOKEN_FILE") => env.token_file = path(),
                Some("CONSUL_CACERT") => env.cacert = path(),
                Some("CONSUL_CLIENT_CERT") => env.client_cert = path(),
                Some("CONSUL_CLIENT_KEY") => env.client_key = path(),
                Some("CONSUL_TLS_SERVER_NAME") => env.tls_server_name = text(),
                Some("CONSUL_HTTP_SSL_VERIFY") => env.ssl_verify = text(),
                _ => {}
            }
        }
        env
    }

    /// The agent's URL: `CONSUL_HTTP_ADDR` with its scheme (`http://`
    /// unless it says `https://` or `CONSUL_HTTP_SSL` is true), else
    /// [`DEFAULT_CONSUL_ADDR`] (`https://` under `CONSUL_HTTP_SSL=true`).
    pub fn address(&self) -> Result<String, String> {
        let ssl = parse_bool("CONSUL_HTTP_SSL", self.http_ssl.as_deref())?.unwrap_or(false);
        let raw = self.http_addr.as_deref().unwrap_or("127.0.0.1:8500");
        let (scheme, rest) = match raw.split_once("://") {
            Some(("http", rest)) => ("http", rest),
            Some(("https", rest)) => ("https", rest),
            Some((other, _)) => {
                return Err(format!(
                    "CONSUL_HTTP_ADDR={raw:?}: the scheme {other}:// is not supported; use host:port, http:// or https://"
                ))
            }
            None => ("http", raw),
        };
        if rest.is_empty() {
            return Err(format!("CONSUL_HTTP_ADDR={raw:?} names no host"));
        }
        let scheme = if ssl { "https" } else { scheme };
        Ok(format!("{scheme}://{rest}"))
    }

    /// The ACL token: the content of `CONSUL_HTTP_TOKEN_FILE` (trimmed)
    /// when it holds one, else `CONSUL_HTTP_TOKEN`. An unreadable file is
    /// an error naming it.
    pub fn acl_token(&self) -> Result<Option<String>, String> {
        if let Some(file) = &self.token_file {
            let text = std::fs::read_to_string(file).map_err(|e| {
                format!(
                    "CONSUL_HTTP_TOKEN_FILE={}: cannot read the token file: {e}",
                    file.display()
                )
            })?;
            let token = text.trim();
            if !token.is_empty() {
                return Ok(Some(token.to_owned()));
            }
        }
        Ok(self.token.clone())
    }

    /// Whether certificate checks are on (`CONSUL_HTTP_SSL_VERIFY` is not
    /// false).
    pub fn verify(&self) -> Result<bool, String> {
        Ok(parse_bool("CONSUL_HTTP_SSL_VERIFY", self.ssl_verify.as_deref())?.unwrap_or(true))
    }

    /// `CONSUL_TLS_SERVER_NAME` without a `:port` suffix.
    pub fn server_name(&self) -> Option<String> {
        let name = self.tls_server_name.as_deref()?;
        let host = match name.rsplit_once(':') {
            // A port after the last `]`, or after a name with no other
            // colon: a bare IPv6 address (`::1`) has no port.
            Some((host, port))
                if !port.contains(']')
                    && port.bytes().all(|b| b.is_ascii_digit())
                    && (!host.contains(':') || host.ends_with(']')) =>
            {
                host
            }
            _ => name,
        };
        Some(
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
        )
    }

    /// HTTPS settings for an `https://` agent from `CONSUL_CACERT`,
    /// `CONSUL_CLIENT_CERT`/`CONSUL_CLIENT_KEY`, `CONSUL_TLS_SERVER_NAME`
    /// and `CONSUL_HTTP_SSL_VERIFY`. Without a CA and with checks on, an
    /// error that says what to set (this client trusts no system roots).
    pub fn tls(&self) -> Result<ConsulTls, String> {
        let client = match (&self.client_cert, &self.client_key) {
            (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
            (None, None) => None,
            _ => {
                return Err(
                    "set both CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY (or --consul-cert and --consul-key), or neither"
                        .into(),
                )
            }
        };
        if !self.verify()? {
            tracing::warn!("CONSUL_HTTP_SSL_VERIFY=false: the Consul agent's certificate is NOT checked; anyone on the path can answer as the agent and list other nodes");
            return ConsulTls::unverified(client);
        }
        let Some(ca) = &self.cacert else {
            return Err(
                "an https:// Consul address needs the CA (PEM) that signed the agent's certificate: set CONSUL_CACERT (the CLI: --consul-ca) or ConsulDiscovery::tls"
                    .into(),
            );
        };
        let name = self.server_name();
        ConsulTls::from_files(ca, client, name.as_deref())
            .map_err(|e| format!("CONSUL_CACERT/CONSUL_CLIENT_CERT/CONSUL_CLIENT_KEY: {e}"))
    }

    /// Whether any HTTPS setting is given.
    pub fn has_tls_settings(&self) -> bool {
        self.cacert.is_some()
            || self.client_cert.is_some()
            || self.client_key.is_some()
            || self.tls_server_name.is_some()
    }
}

impl std::fmt::Debug for ConsulEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: shown only as set or not.
        f.debug_struct("ConsulEnv")
            .field("http_addr", &self.http_addr)
            .field("http_ssl", &self.http_ssl)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("token_file", &self.token_file)
            .field("cacert", &self.cacert)
            .field("client_cert", &self.client_cert)
            .field("client_key", &self.client_key)
            .field("tls_server_name", &self.tls_server_name)
            .field("ssl_verify", &self.ssl_verify)
            .finish()
    }
}

/// Go's `strconv.ParseBool`, which Consul uses for its boolean variables.
fn parse_bool(name: &str, value: Option<&str>) -> Result<Option<bool>, String> {
    match value {
        None => Ok(None),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(Some(true)),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(Some(false)),
        Some(other) => Err(format!(
            "{name}={other:?} is not a boolean: use true or false"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> ConsulEnv {
        ConsulEnv::from_vars(vars.iter().copied())
    }

    #[test]
    fn the_address_follows_consuls_rules_for_schemes() {
        assert_eq!(env(&[]).address().unwrap(), DEFAULT_CONSUL_ADDR);
        let a = |v: &[(&str, &str)]| env(v).address().unwrap();
        assert_eq!(
            a(&[("CONSUL_HTTP_ADDR", "10.0.0.1:8500")]),
            "http://10.0.0.1:8500"
        );
        assert_eq!(
            a(&[("CONSUL_HTTP_ADDR", "https://c:8501")]),
            "https://c:8501"
        );
        assert_eq!(a(&[("CONSUL_HTTP_ADDR", "http://c:8500")]), "http://c:8500");
        // CONSUL_HTTP_SSL=true is never undone by an http:// address.
        let ssl = [
            ("CONSUL_HTTP_ADDR", "http://c:8501"),
            ("CONSUL_HTTP_SSL", "true"),
        ];
        assert_eq!(a(&ssl), "https://c:8501");
        assert_eq!(a(&[("CONSUL_HTTP_SSL", "1")]), "https://127.0.0.1:8500");
        // Empty counts as unset.
        assert_eq!(a(&[("CONSUL_HTTP_ADDR", "")]), DEFAULT_CONSUL_ADDR);
        let e = env(&[("CONSUL_HTTP_ADDR", "unix:///run/consul.sock")])
            .address()
            .unwrap_err();
        assert!(e.contains("unix://") && e.contains("not supported"), "{e}");
        let e = env(&[("CONSUL_HTTP_SSL", "yes")]).address().unwrap_err();
        assert!(
            e.contains("CONSUL_HTTP_SSL") && e.contains("true or false"),
            "{e}"
        );
    }

    #[test]
    fn a_token_file_wins_over_the_token_unless_it_is_empty() {
        let dir = std::env::temp_dir().join(format!("idgen-consul-env-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, " from-file \n").unwrap();
        let file_s = file.to_str().unwrap();
        let both = env(&[
            ("CONSUL_HTTP_TOKEN", "plain"),
            ("CONSUL_HTTP_TOKEN_FILE", file_s),
        ]);
        assert_eq!(both.acl_token().unwrap().as_deref(), Some("from-file"));
        std::fs::write(&file, "\n").unwrap();
        assert_eq!(both.acl_token().unwrap().as_deref(), Some("plain"));
        let only = env(&[("CONSUL_HTTP_TOKEN", "plain")]);
        assert_eq!(only.acl_token().unwrap().as_deref(), Some("plain"));
        assert_eq!(env(&[]).acl_token().unwrap(), None);
        let missing = env(&[("CONSUL_HTTP_TOKEN_FILE", "/nonexistent/idgen-token")]);
        let e = missing.acl_token().unwrap_err();
        assert!(
            e.contains("CONSUL_HTTP_TOKEN_FILE=/nonexistent/idgen-token"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tls_settings_say_what_is_missing() {
        let e = env(&[]).tls().unwrap_err();
        assert!(e.contains("CONSUL_CACERT"), "{e}");
        let e = env(&[("CONSUL_CLIENT_CERT", "/c.pem")]).tls().unwrap_err();
        assert!(e.contains("CONSUL_CLIENT_KEY"), "{e}");
        let e = env(&[("CONSUL_HTTP_SSL_VERIFY", "nope")])
            .tls()
            .unwrap_err();
        assert!(e.contains("CONSUL_HTTP_SSL_VERIFY"), "{e}");
        // Checks off: no CA needed.
        assert!(env(&[("CONSUL_HTTP_SSL_VERIFY", "false")]).tls().is_ok());
        let e = env(&[("CONSUL_CACERT", "/nonexistent/ca.pem")])
            .tls()
            .unwrap_err();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }

    #[test]
    fn the_server_name_loses_its_port() {
        let name = |v: &str| env(&[("CONSUL_TLS_SERVER_NAME", v)]).server_name();
        assert_eq!(
            name("consul.internal:8501").as_deref(),
            Some("consul.internal")
        );
        assert_eq!(name("consul.internal").as_deref(), Some("consul.internal"));
        assert_eq!(name("[::1]:8501").as_deref(), Some("::1"));
        // A bare IPv6 address keeps its last group.
        assert_eq!(name("::1").as_deref(), Some("::1"));
        assert_eq!(name("fd00::8501").as_deref(), Some("fd00::8501"));
        assert_eq!(name("[fd00::1]").as_deref(), Some("fd00::1"));
        assert_eq!(env(&[]).server_name(), None);
    }
}
