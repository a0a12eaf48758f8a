//! Tokens, principals and what each may do.
//!
//! The config file lists tokens. Each names a principal, carries one or more roles and,
//! optionally, the queue-name patterns it is limited to:
//!
//! ```toml
//! [[tokens]]
//! name = "ci-producer"
//! token_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! roles = ["produce"]
//! queues = ["jobs", "ml.*"]
//! members = ["ci/*"]
//! ```
//!
//! `token_sha256` is the lowercase hex SHA-256 of the token, so the file holds no secret;
//! `token` (the token itself) is accepted too, with a warning at start. `members`
//! limits the member names the token may use (glob patterns; absent = any name). Names
//! are unique: two tokens with one name would be one principal, so that is refused. Roles: `produce` (enqueue, read its
//! tasks, wait, cancel), `consume` (member sessions, claim, renew, settle, read its
//! tasks), `admin` (everything, including queue management, redrive, discard, members).
//! With no tokens configured the daemon makes one admin token of its own in its data
//! directory (see [`LOCAL_TOKEN_FILE`]), unless it runs `--open`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde::Deserialize;

use muster_protocol::ops::{PrincipalInfo, Role as WireRole};
use muster_protocol::{ErrorBody, ErrorCode};

/// Shortest token accepted in the config file, in bytes: tokens must not be guessable.
pub const MIN_TOKEN_BYTES: usize = 16;

/// A role a token grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Enqueue, read tasks, wait, cancel.
    Produce,
    /// Member sessions, claim, renew, settle, read tasks.
    Consume,
    /// Resume suspended tasks (by token or task id) and cancel them, read tasks.
    Approve,
    /// Everything.
    Admin,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Produce => "produce",
            Role::Consume => "consume",
            Role::Approve => "approve",
            Role::Admin => "admin",
        }
    }
}

/// An authenticated client: the token's name, roles and queue patterns.
#[derive(Debug, Clone)]
pub struct Principal {
    /// The token's name, as configured.
    pub name: String,
    roles: Vec<Role>,
    /// Queue-name patterns; empty means every queue.
    queues: Vec<glob::Pattern>,
    /// Member-name patterns; empty means any name.
    members: Vec<glob::Pattern>,
    /// Whether member names it uses are bound to it. Not for the local-only token:
    /// with one principal there is nobody to keep a name from.
    binds_members: bool,
}

impl Principal {
    /// Whether it is one of several configured tokens (not the local-only token, the
    /// daemon's one user): its use of what tokens share (member names, a queue's label
    /// sets) is counted against it.
    pub fn is_tenant(&self) -> bool {
        self.binds_members
    }

    /// Whether the principal holds `role` (admin holds every role).
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role) || self.roles.contains(&Role::Admin)
    }

    /// Whether the principal's patterns cover `queue`.
    pub fn covers(&self, queue: &str) -> bool {
        self.queues.is_empty() || self.queues.iter().any(|p| p.matches(queue))
    }

    /// Whether member names it uses become its own (see [`Principal::binds_members`]).
    pub fn binds_members(&self) -> bool {
        self.binds_members
    }

    /// Whether the principal covers every queue (no queue patterns).
    pub fn covers_all(&self) -> bool {
        self.queues.is_empty()
    }

    /// What `hello` tells the client of it: its name, roles and patterns as configured.
    pub fn info(&self) -> PrincipalInfo {
        let patterns = |ps: &[glob::Pattern]| ps.iter().map(|p| p.as_str().to_owned()).collect();
        PrincipalInfo {
            name: self.name.clone(),
            roles: self
                .roles
                .iter()
                .map(|r| match r {
                    Role::Produce => WireRole::Produce,
                    Role::Consume => WireRole::Consume,
                    Role::Approve => WireRole::Approve,
                    Role::Admin => WireRole::Admin,
                })
                .collect(),
            queues: patterns(&self.queues),
            members: patterns(&self.members),
        }
    }

    /// `forbidden` unless the principal's member patterns allow the name `member`.
    pub fn check_member(&self, member: &str) -> Result<(), ErrorBody> {
        if self.members.is_empty() || self.members.iter().any(|p| p.matches(member)) {
            return Ok(());
        }
        Err(ErrorBody::new(
            ErrorCode::Forbidden,
            format!(
                "token {:?} may not use the member name {member:?}",
                self.name
            ),
        ))
    }

    /// `forbidden` unless the principal holds one of `roles` and covers `queue`.
    pub fn check(&self, roles: &[Role], queue: Option<&str>) -> Result<(), ErrorBody> {
        if !roles.iter().any(|r| self.has(*r)) {
            let wanted: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
            return Err(ErrorBody::new(
                ErrorCode::Forbidden,
                format!(
                    "token {:?} lacks the role {}",
                    self.name,
                    wanted.join(" or ")
                ),
            ));
        }
        if let Some(q) = queue
            && !self.covers(q)
        {
            return Err(ErrorBody::new(
                ErrorCode::Forbidden,
                format!("token {:?} does not cover queue {q:?}", self.name),
            ));
        }
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    tokens: Vec<TokenEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    token: Option<String>,
    token_sha256: Option<String>,
    roles: Vec<Role>,
    #[serde(default)]
    queues: Vec<String>,
    #[serde(default)]
    members: Vec<String>,
}

/// The file in the data directory that holds the daemon's own admin token when no
/// tokens are configured (mode 0600): local clients of the daemon's user read it, other
/// users cannot.
pub const LOCAL_TOKEN_FILE: &str = muster_protocol::LOCAL_TOKEN_FILE;

/// The principal of the data directory's token.
pub const LOCAL_PRINCIPAL: &str = "local";

/// The configured tokens, by the SHA-256 of the token.
#[derive(Debug, Default)]
pub struct Tokens {
    by_digest: HashMap<[u8; 32], Arc<Principal>>,
    /// Names of the tokens written in the config in plain text (`token =`).
    plaintext: Vec<String>,
}

impl Tokens {
    /// Reads the tokens of a config file.
    pub fn load(path: &Path) -> anyhow::Result<Tokens> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        Tokens::parse(&text).with_context(|| format!("in config {}", path.display()))
    }

    /// Parses the tokens of a config file's text.
    pub fn parse(text: &str) -> anyhow::Result<Tokens> {
        let file: ConfigFile = toml::from_str(text).context("parsing TOML")?;
        let mut tokens = Tokens::default();
        let mut names: HashMap<String, usize> = HashMap::new();
        for (index, entry) in file.tokens.into_iter().enumerate() {
            if let Some(first) = names.insert(entry.name.clone(), index) {
                bail!(
                    "tokens {} and {} are both named {:?}: each token needs a name of its own \
                     (one name is one principal, with its member names and leases)",
                    first + 1,
                    index + 1,
                    entry.name
                );
            }
            let digest = match (&entry.token, &entry.token_sha256) {
                (Some(token), None) => {
                    if token.len() < MIN_TOKEN_BYTES {
                        bail!(
                            "token {:?} is shorter than {MIN_TOKEN_BYTES} bytes",
                            entry.name
                        );
                    }
                    tokens.plaintext.push(entry.name.clone());
                    digest(token)
                }
                (None, Some(hex_digest)) => {
                    let bytes = hex::decode(hex_digest)
                        .ok()
                        .and_then(|b| <[u8; 32]>::try_from(b).ok());
                    bytes.with_context(|| {
                        format!("token_sha256 of {:?} is not 64 hex digits", entry.name)
                    })?
                }
                _ => bail!(
                    "token {:?} needs exactly one of token and token_sha256",
                    entry.name
                ),
            };
            if entry.roles.is_empty() {
                bail!("token {:?} has no roles", entry.name);
            }
            let queues = entry
                .queues
                .iter()
                .map(|q| glob::Pattern::new(q).with_context(|| format!("queue pattern {q:?}")))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let members = entry
                .members
                .iter()
                .map(|m| glob::Pattern::new(m).with_context(|| format!("member pattern {m:?}")))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let principal = Principal {
                name: entry.name.clone(),
                roles: entry.roles,
                queues,
                members,
                binds_members: true,
            };
            if tokens
                .by_digest
                .insert(digest, Arc::new(principal))
                .is_some()
            {
                bail!("token {:?} repeats another token", entry.name);
            }
        }
        Ok(tokens)
    }

    /// The daemon's own admin token, for local-only mode: whoever can read the data
    /// directory's token file is an admin, nobody else is served.
    pub fn local(token: &str) -> Tokens {
        let principal = Principal {
            name: LOCAL_PRINCIPAL.to_owned(),
            roles: vec![Role::Admin],
            queues: Vec::new(),
            members: Vec::new(),
            binds_members: false,
        };
        Tokens {
            by_digest: HashMap::from([(digest(token), Arc::new(principal))]),
            plaintext: Vec::new(),
        }
    }

    /// True for the one token of a local-only daemon ([`Tokens::local`]).
    pub fn is_local(&self) -> bool {
        self.by_digest.len() == 1
            && self
                .by_digest
                .values()
                .all(|p| p.name == LOCAL_PRINCIPAL && !p.binds_members)
    }

    /// True if no token is configured: the daemon is open to whoever can connect.
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// Names of the consuming tokens that may use any member name (no `members`
    /// patterns) while the config holds other tokens: each could take another tenant's
    /// agent names first, to warn about.
    pub fn unconfined_members(&self) -> Vec<String> {
        if self.by_digest.len() < 2 {
            return Vec::new();
        }
        let mut names: Vec<String> = self
            .by_digest
            .values()
            .filter(|p| p.binds_members && p.has(Role::Consume) && p.members.is_empty())
            .map(|p| p.name.clone())
            .collect();
        names.sort();
        names
    }

    /// Names of the tokens the config holds in plain text, to warn about.
    pub fn plaintext(&self) -> &[String] {
        &self.plaintext
    }

    /// How many tokens are configured.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// The principal a presented token names, if any.
    pub fn authenticate(&self, token: &str) -> Option<Arc<Principal>> {
        self.by_digest.get(&digest(token)).cloned()
    }
}

/// The SHA-256 of a token, as `token_sha256` holds it.
pub fn digest_hex(token: &str) -> String {
    hex::encode(digest(token))
}

/// The SHA-256 of a token: tokens are compared by their digests.
pub fn digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
[[tokens]]
name = "producer"
token = "produce-token-0123456789"
roles = ["produce"]
queues = ["jobs", "ml.*"]
members = ["ci/*"]

[[tokens]]
name = "ops"
token_sha256 = "0000000000000000000000000000000000000000000000000000000000000001"
roles = ["admin"]
"#;

    #[test]
    fn tokens_name_principals_with_roles_and_patterns() {
        let tokens = Tokens::parse(CONFIG).unwrap();
        let p = tokens.authenticate("produce-token-0123456789").unwrap();
        assert_eq!(p.name, "producer");
        assert!(p.has(Role::Produce) && !p.has(Role::Consume) && !p.has(Role::Admin));
        assert!(p.covers("jobs") && p.covers("ml.gpu") && !p.covers("jobs2") && !p.covers("other"));
        assert_eq!(p.check(&[Role::Produce], Some("ml.x")), Ok(()));
        assert_eq!(
            p.check(&[Role::Consume], Some("jobs")).unwrap_err().code,
            ErrorCode::Forbidden
        );
        assert_eq!(
            p.check(&[Role::Produce], Some("other")).unwrap_err().code,
            ErrorCode::Forbidden
        );
        assert!(tokens.authenticate("wrong").is_none());
        assert_eq!(
            p.info(),
            PrincipalInfo {
                name: "producer".into(),
                roles: vec![WireRole::Produce],
                queues: vec!["jobs".into(), "ml.*".into()],
                members: vec!["ci/*".into()],
            }
        );
        let local = Tokens::local("local-token-0123456789").authenticate("local-token-0123456789");
        assert_eq!(
            local.map(|p| p.info()),
            Some(PrincipalInfo {
                name: LOCAL_PRINCIPAL.into(),
                roles: vec![WireRole::Admin],
                queues: Vec::new(),
                members: Vec::new(),
            })
        );
        assert_eq!(p.check_member("ci/7"), Ok(()));
        let refused = p.check_member("gpu/1").unwrap_err();
        assert_eq!(refused.code, ErrorCode::Forbidden);
        assert!(
            refused.message.contains("member name \"gpu/1\""),
            "{}",
            refused.message
        );
        let mut one = [0u8; 32];
        one[31] = 1;
        let ops = &tokens.by_digest[&one];
        assert_eq!(ops.check_member("anything"), Ok(()));
        assert_eq!(tokens.plaintext(), ["producer".to_owned()]);
        // The admin (who consumes too) may use any name among other tenants: warned of.
        assert_eq!(tokens.unconfined_members(), ["ops".to_owned()]);
        assert!(Tokens::local("x").unconfined_members().is_empty());
    }

    #[test]
    fn bad_configs_are_refused_with_a_reason() {
        let cases = [
            (
                "[[tokens]]\nname = \"a\"\ntoken = \"short\"\nroles = [\"admin\"]\n",
                "shorter than 16",
            ),
            (
                "[[tokens]]\nname = \"a\"\nroles = [\"admin\"]\n",
                "exactly one of",
            ),
            (
                "[[tokens]]\nname = \"a\"\ntoken = \"0123456789abcdefX\"\nroles = []\n",
                "no roles",
            ),
            (
                "[[tokens]]\nname = \"a\"\ntoken = \"0123456789abcdefX\"\nroles = [\"root\"]\n",
                "unknown variant",
            ),
            (
                "[[tokens]]\nname = \"a\"\ntoken_sha256 = \"zz\"\nroles = [\"admin\"]\n",
                "64 hex digits",
            ),
            (
                "[[tokens]]\nname = \"a\"\ntoken = \"0123456789abcdefX\"\nroles = [\"admin\"]\nqueues = [\"[\"]\n",
                "queue pattern",
            ),
            (
                "[[tokens]]\nname = \"a\"\ntoken = \"0123456789abcdefX\"\nroles = [\"admin\"]\nmembers = [\"[\"]\n",
                "member pattern",
            ),
            (
                "[[tokens]]\nname = \"prod\"\ntoken = \"0123456789abcdefX\"\nroles = [\"consume\"]\n\
                 [[tokens]]\nname = \"sandbox\"\ntoken = \"0123456789abcdefY\"\nroles = [\"consume\"]\n\
                 [[tokens]]\nname = \"prod\"\ntoken = \"0123456789abcdefZ\"\nroles = [\"consume\"]\n",
                "tokens 1 and 3 are both named \"prod\"",
            ),
        ];
        for (text, want) in cases {
            let err = format!("{:#}", Tokens::parse(text).unwrap_err());
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}
