//! ACL tokens and what they allow. A small subset of Consul's rule
//! language: enough to express idgen's minimal policy (see consul/acl-policy.hcl) and to
//! check that a client handles 403s and txn ACL errors.

use std::collections::HashMap;

/// The rules attached to a token made with
/// [`TestConsul::add_token`](crate::TestConsul::add_token).
///
/// Prefix rules match like Consul's `key_prefix`: `"idgen/"` covers
/// `"idgen/workers/3"`, and `""` covers every key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// `key_prefix "<p>" { policy = "write" }` for each entry (write
    /// implies read).
    pub key_prefix_write: Vec<String>,
    /// `key_prefix "<p>" { policy = "read" }` for each entry.
    pub key_prefix_read: Vec<String>,
    /// `session_prefix "" { policy = "write" }`: create, renew and destroy
    /// sessions (and read them).
    pub session_write: bool,
    /// `service "<name>" { policy = "write" }` for each entry: exact service
    /// names that may be registered, deregistered and have their checks
    /// updated (and read).
    pub service_write: Vec<String>,
    /// Read access to everything: keys, sessions, services and nodes.
    pub read_all: bool,
}

impl Policy {
    pub(crate) fn key_read(&self, key: &str) -> bool {
        self.read_all
            || self
                .key_prefix_read
                .iter()
                .chain(&self.key_prefix_write)
                .any(|p| key.starts_with(p.as_str()))
    }

    pub(crate) fn key_write(&self, key: &str) -> bool {
        self.key_prefix_write
            .iter()
            .any(|p| key.starts_with(p.as_str()))
    }

    /// Whether every key under `prefix` is writable, which Consul demands for
    /// recursive deletes.
    pub(crate) fn key_write_prefix(&self, prefix: &str) -> bool {
        self.key_write(prefix)
    }

    pub(crate) fn service_write(&self, name: &str) -> bool {
        self.service_write.iter().any(|s| s == name)
    }

    pub(crate) fn service_read(&self, name: &str) -> bool {
        self.read_all || self.service_write(name)
    }
}

/// What the caller of one request may do.
#[derive(Debug, Clone)]
pub(crate) enum Access {
    /// ACLs are off, or the master token was sent.
    All,
    /// A token with a policy.
    Policy(Policy),
}

impl Access {
    pub(crate) fn key_read(&self, key: &str) -> bool {
        match self {
            Access::All => true,
            Access::Policy(p) => p.key_read(key),
        }
    }

    pub(crate) fn key_write(&self, key: &str) -> bool {
        match self {
            Access::All => true,
            Access::Policy(p) => p.key_write(key),
        }
    }

    pub(crate) fn key_write_prefix(&self, prefix: &str) -> bool {
        match self {
            Access::All => true,
            Access::Policy(p) => p.key_write_prefix(prefix),
        }
    }

    pub(crate) fn session_write(&self) -> bool {
        match self {
            Access::All => true,
            Access::Policy(p) => p.session_write,
        }
    }

    pub(crate) fn session_read(&self) -> bool {
        match self {
            Access::All => true,
            Access::Policy(p) => p.session_write || p.read_all,
        }
    }

    pub(crate) fn service_write(&self, name: &str) -> bool {
        match self {
            Access::All => true,
            Access::Policy(p) => p.service_write(name),
        }
    }

    pub(crate) fn service_read(&self, name: &str) -> bool {
        match self {
            Access::All => true,
            Access::Policy(p) => p.service_read(name),
        }
    }
}

/// The token table. `master` is `None` when ACLs are disabled.
#[derive(Debug, Default)]
pub(crate) struct AclTable {
    master: Option<String>,
    tokens: HashMap<String, Policy>,
}

impl AclTable {
    pub(crate) fn new(master: Option<String>) -> Self {
        AclTable {
            master,
            tokens: HashMap::new(),
        }
    }

    pub(crate) fn add(&mut self, secret: &str, policy: Policy) {
        self.tokens.insert(secret.to_owned(), policy);
    }

    /// `None` means the request is denied outright (ACLs on, no valid token).
    pub(crate) fn resolve(&self, token: Option<&str>) -> Option<Access> {
        let Some(master) = &self.master else {
            return Some(Access::All);
        };
        let token = token?;
        if token == master {
            return Some(Access::All);
        }
        self.tokens
            .get(token)
            .map(|policy| Access::Policy(policy.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idgen_policy() -> Policy {
        Policy {
            key_prefix_write: vec!["idgen/".into()],
            session_write: true,
            service_write: vec!["idgen".into()],
            ..Policy::default()
        }
    }

    #[test]
    fn prefix_rules_match_like_consul() {
        let p = idgen_policy();
        assert!(p.key_write("idgen/workers/1"));
        assert!(p.key_read("idgen/workers/1"));
        assert!(!p.key_write("other/x"));
        assert!(!p.key_read("other/x"));
        assert!(p.key_write_prefix("idgen/workers/"));
        assert!(!p.key_write_prefix("idg"));
        assert!(p.service_write("idgen"));
        assert!(!p.service_write("idgen-admin"));
        assert!(!p.service_read("web"));
    }

    #[test]
    fn table_resolves_tokens_only_when_enabled() {
        let open = AclTable::new(None);
        assert!(matches!(open.resolve(None), Some(Access::All)));

        let mut table = AclTable::new(Some("root".into()));
        table.add("idgen-token", idgen_policy());
        assert!(table.resolve(None).is_none());
        assert!(table.resolve(Some("nope")).is_none());
        assert!(matches!(table.resolve(Some("root")), Some(Access::All)));
        assert!(matches!(
            table.resolve(Some("idgen-token")),
            Some(Access::Policy(_))
        ));
    }
}
