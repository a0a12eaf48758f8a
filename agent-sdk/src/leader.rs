//! Finding a cluster's leader among the addresses a client was given.
//!
//! Every address is connected to at once and says `hello`; the first whose reply
//! names no cluster (a single daemon) or names itself the leader is kept, the others
//! are closed. A node that names a leader at an address not among those given is
//! asked too. While no node leads (an election), each address is asked again
//! [`FIND_LEADER_RETRY`] after its last answer, up to [`FIND_LEADER_TIMEOUT`]; then
//! the connect fails with what each address said last. An address that refused
//! outright (a wrong token, say) is not asked again, and once every address has, the
//! connect fails at once.

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;

use muster_protocol::ErrorCode;
use muster_protocol::ops::ClusterHello;

use crate::connect::{self, ConnectOptions, FIND_LEADER_RETRY, FIND_LEADER_TIMEOUT, MAX_ADDRESSES};
use crate::{Client, Error};

/// What an address answered, as far as finding the leader goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A single daemon, or the cluster's leader: the connection to keep.
    Serves,
    /// A cluster node that does not lead; `leader_addr` is where it says the leader is.
    Follows {
        /// What it said, for the error of a search that fails.
        said: String,
        /// The leader's client address, when the node knows it.
        leader_addr: Option<String>,
    },
}

/// Judges a `hello` reply's cluster object.
pub(crate) fn judge(cluster: Option<&ClusterHello>) -> Answer {
    let Some(c) = cluster else {
        return Answer::Serves;
    };
    if c.leader == Some(c.node) {
        return Answer::Serves;
    }
    let said = match (c.leader, &c.leader_addr) {
        (Some(leader), Some(addr)) => {
            format!(
                "node {} (term {}) follows node {leader} at {addr}",
                c.node, c.term
            )
        }
        (Some(leader), None) => format!(
            "node {} (term {}) follows node {leader}, address unknown",
            c.node, c.term
        ),
        (None, _) => format!("node {} (term {}) knows no leader", c.node, c.term),
    };
    Answer::Follows {
        said,
        leader_addr: c.leader_addr.clone(),
    }
}

/// One line per address of what it said last, `ADDR: WHAT; ADDR: WHAT`, the address
/// not repeated when the text starts with it already.
pub(crate) fn summary(said: &[(String, String)]) -> String {
    said.iter()
        .map(|(addr, what)| {
            if what.contains(addr.as_str()) {
                what.clone()
            } else {
                format!("{addr}: {what}")
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether asking again cannot change a failed hello: the daemon answered and refused
/// (a wrong token, say), not "ask someone else" or "shutting down".
fn is_final(e: &Error) -> bool {
    match e {
        Error::Server(body) => !matches!(
            body.code,
            ErrorCode::NotLeader | ErrorCode::OutcomeUnknown | ErrorCode::ShuttingDown
        ),
        Error::InvalidInput(_) | Error::Config(_) => true,
        _ => false,
    }
}

/// Connects to one address, `after` a pause, with the options' trust and token; the
/// certificate's name is the options' `server_name`, else the address's host.
async fn attempt(
    options: &ConnectOptions,
    endpoint: Option<&quinn::Endpoint>,
    addr: String,
    after: Duration,
) -> (String, Result<Client, Error>) {
    tokio::time::sleep(after).await;
    let one = ConnectOptions {
        addr: addr.clone(),
        ..options.clone()
    };
    let result = match endpoint {
        Some(endpoint) => match connect::open_on(endpoint, &one).await {
            Ok(conn) => Client::start(conn, None, &one).await,
            Err(e) => Err(e),
        },
        None => match connect::open_own(&one).await {
            Ok((endpoint, conn)) => Client::start(conn, Some(endpoint), &one).await,
            Err(e) => Err(e),
        },
    };
    (addr, result)
}

/// The addresses asked while finding the leader, and what each said last.
struct Search {
    /// The addresses given, then those the nodes named as leader (at most
    /// [`MAX_ADDRESSES`]).
    addrs: Vec<String>,
    /// What each address said last, in the order they first said something.
    said: Vec<(String, String)>,
}

impl Search {
    /// Notes what `addr` said.
    fn note(&mut self, addr: &str, what: String) {
        match self.said.iter_mut().find(|(a, _)| a == addr) {
            Some(entry) => entry.1 = what,
            None => self.said.push((addr.to_owned(), what)),
        }
    }

    /// Adds the leader a node named, unless it is known, malformed or one too many;
    /// returns it when it was added, to be asked.
    fn learn(&mut self, leader: Option<String>) -> Option<String> {
        let leader = leader?;
        let new = !self.addrs.contains(&leader)
            && self.addrs.len() < MAX_ADDRESSES
            && connect::is_host_port(&leader);
        new.then(|| {
            self.addrs.push(leader.clone());
            leader
        })
    }

    /// The error of a search that found no leader: what each address said, in the
    /// order the addresses were given (then those the nodes named).
    fn failed(&self, timed_out: bool) -> Error {
        let said: Vec<(String, String)> = self
            .addrs
            .iter()
            .map(|addr| {
                let what = self.said.iter().find(|(a, _)| a == addr);
                let what = what.map_or_else(|| "no answer".into(), |(_, w)| w.clone());
                (addr.clone(), what)
            })
            .collect();
        let how = if timed_out {
            format!("within {} s", FIND_LEADER_TIMEOUT.as_secs())
        } else {
            "(every address refused)".to_owned()
        };
        Error::Connect(format!(
            "no leader found among {} {how}: {}",
            self.addrs.join(","),
            summary(&said)
        ))
    }
}

/// Connects to the leader among the options' addresses (or the single daemon there).
/// With one address whose daemon is not a cluster node, or leads, this is one connect
/// whose error, if any, is returned as it is.
pub(crate) async fn find(
    options: &ConnectOptions,
    endpoint: Option<&quinn::Endpoint>,
) -> Result<Client, Error> {
    let mut search = Search {
        addrs: connect::addresses(&options.addr)?,
        said: Vec::new(),
    };
    let deadline = Instant::now() + FIND_LEADER_TIMEOUT;
    if let [only] = search.addrs.as_slice() {
        let (addr, result) = attempt(options, endpoint, only.clone(), Duration::ZERO).await;
        let client = result?;
        match judge(client.cluster().as_ref()) {
            Answer::Serves => return Ok(client),
            Answer::Follows { said, leader_addr } => {
                search.note(&addr, said);
                search.learn(leader_addr);
            }
        }
    }
    // Each address is asked on its own: again FIND_LEADER_RETRY after each answer that
    // names no leader here or each failure that asking again may mend, so a slow or
    // silent address holds up no other.
    let mut tries = FuturesUnordered::new();
    for addr in &search.addrs {
        tries.push(attempt(options, endpoint, addr.clone(), Duration::ZERO));
    }
    let timed_out = loop {
        let (addr, result) = match tokio::time::timeout_at(deadline, tries.next()).await {
            Ok(Some(next)) => next,
            // Every address refused outright: asking again cannot help.
            Ok(None) => break false,
            Err(_) => break true,
        };
        let again = match result {
            Ok(client) => match judge(client.cluster().as_ref()) {
                // The other connections are dropped, which closes them.
                Answer::Serves => return Ok(client),
                Answer::Follows { said, leader_addr } => {
                    search.note(&addr, said);
                    if let Some(leader) = search.learn(leader_addr) {
                        tries.push(attempt(options, endpoint, leader, Duration::ZERO));
                    }
                    true
                }
            },
            Err(e) => {
                search.note(&addr, e.to_string());
                !is_final(&e)
            }
        };
        if again {
            tries.push(attempt(options, endpoint, addr, FIND_LEADER_RETRY));
        }
    };
    Err(search.failed(timed_out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(node: u64, leader: Option<u64>, leader_addr: Option<&str>) -> ClusterHello {
        ClusterHello {
            cluster_id: "prod".into(),
            node,
            term: 3,
            leader,
            leader_addr: leader_addr.map(Into::into),
        }
    }

    #[test]
    fn a_single_daemon_or_the_leader_is_kept_and_a_follower_names_the_leader() {
        assert_eq!(judge(None), Answer::Serves);
        assert_eq!(judge(Some(&hello(2, Some(2), Some("b:1")))), Answer::Serves);
        assert_eq!(
            judge(Some(&hello(1, Some(2), Some("b:1")))),
            Answer::Follows {
                said: "node 1 (term 3) follows node 2 at b:1".into(),
                leader_addr: Some("b:1".into()),
            }
        );
        assert_eq!(
            judge(Some(&hello(1, Some(2), None))),
            Answer::Follows {
                said: "node 1 (term 3) follows node 2, address unknown".into(),
                leader_addr: None,
            }
        );
        assert_eq!(
            judge(Some(&hello(3, None, None))),
            Answer::Follows {
                said: "node 3 (term 3) knows no leader".into(),
                leader_addr: None,
            }
        );
    }

    #[test]
    fn the_summary_names_each_address_once_on_one_line() {
        let said = [
            (
                "a:1".to_owned(),
                "node 1 (term 3) knows no leader".to_owned(),
            ),
            (
                "b:2".to_owned(),
                "connect: b:2: nothing listens there".to_owned(),
            ),
        ];
        assert_eq!(
            summary(&said),
            "a:1: node 1 (term 3) knows no leader; connect: b:2: nothing listens there"
        );
    }

    #[test]
    fn only_a_refusal_that_asking_again_cannot_change_is_final() {
        use muster_protocol::ErrorBody;
        let server = |code| Error::Server(ErrorBody::new(code, "m"));
        assert!(is_final(&server(ErrorCode::Unauthorized)));
        assert!(is_final(&server(ErrorCode::BadRequest)));
        assert!(!is_final(&server(ErrorCode::NotLeader)));
        assert!(!is_final(&server(ErrorCode::OutcomeUnknown)));
        assert!(!is_final(&server(ErrorCode::ShuttingDown)));
        assert!(!is_final(&Error::Connect("refused".into())));
    }
}
