//! The cluster's clock: the heartbeat and the election timeout every other wait of
//! the cluster derives from (elections, check-quorum, a leader's lease).

use std::time::Duration;

use openraft::Config;

/// How often the leader sends heartbeats, unless `--cluster-heartbeat` says otherwise.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_millis(100);

/// The election timeout, unless `--cluster-election-timeout` says otherwise: see
/// [`Timing`].
pub const DEFAULT_ELECTION_TIMEOUT: Duration = Duration::from_millis(400);

// The defaults keep the rule `Timing::new` checks: a follower misses two heartbeats in a
// row without starting an election.
const _: () = assert!(
    DEFAULT_ELECTION_TIMEOUT.as_millis()
        >= DEFAULT_HEARTBEAT.as_millis() * ELECTION_TIMEOUT_MIN_HEARTBEATS as u128
);

/// The heartbeats a [`Timing`] allows, from a LAN's fastest useful rate to a slow WAN's.
pub const HEARTBEAT_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(20)..=Duration::from_secs(1);

/// Least election timeout, in heartbeats: a follower must be able to miss two
/// heartbeats in a row without starting an election.
pub const ELECTION_TIMEOUT_MIN_HEARTBEATS: u32 = 3;

/// Longest election timeout a [`Timing`] allows.
pub const ELECTION_TIMEOUT_MAX: Duration = Duration::from_secs(10);

/// The cluster's clock: the heartbeat, and the election timeout `T` every other wait
/// derives from.
///
/// - A follower that has not heard from its leader for the leader's *lease* (1.5 `T`)
///   plus a random part of `T / 2` asks for a pre-vote, then stands; it refuses votes to
///   others while its leader's lease holds (openraft's rule).
/// - A leader that has not heard from a majority for `T` stops serving, fails the rounds
///   it was waiting for (`outcome_unknown`) and stops sending heartbeats, so that the
///   others elect a new leader at once instead of hearing from one that cannot commit
///   (check-quorum): an isolated leader, or one whose messages arrive but whose
///   answers do not.
///
/// So a leader's death or isolation costs about 1.5–2 `T` before a new leader serves.
/// All nodes of a cluster should run with the same timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    heartbeat: Duration,
    election_timeout: Duration,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            heartbeat: DEFAULT_HEARTBEAT,
            election_timeout: DEFAULT_ELECTION_TIMEOUT,
        }
    }
}

impl Timing {
    /// A timing, or why it is not one: the heartbeat within [`HEARTBEAT_RANGE`], the
    /// election timeout at least [`ELECTION_TIMEOUT_MIN_HEARTBEATS`] heartbeats and at
    /// most [`ELECTION_TIMEOUT_MAX`].
    pub fn new(heartbeat: Duration, election_timeout: Duration) -> Result<Timing, String> {
        if !HEARTBEAT_RANGE.contains(&heartbeat) {
            return Err(format!(
                "--cluster-heartbeat must be {} to {} ms, not {} ms",
                HEARTBEAT_RANGE.start().as_millis(),
                HEARTBEAT_RANGE.end().as_millis(),
                heartbeat.as_millis()
            ));
        }
        let least = heartbeat * ELECTION_TIMEOUT_MIN_HEARTBEATS;
        if election_timeout < least || election_timeout > ELECTION_TIMEOUT_MAX {
            return Err(format!(
                "--cluster-election-timeout must be {} to {} ms ({ELECTION_TIMEOUT_MIN_HEARTBEATS} heartbeats at least), not {} ms",
                least.as_millis(),
                ELECTION_TIMEOUT_MAX.as_millis(),
                election_timeout.as_millis()
            ));
        }
        let timing = Timing {
            heartbeat,
            election_timeout,
        };
        assert!(
            timing.leader_lease() > timing.election_timeout()
                && timing.election_timeout() > timing.heartbeat(),
            "heartbeat < election timeout < leader lease"
        );
        Ok(timing)
    }

    /// How often the leader sends heartbeats.
    pub fn heartbeat(self) -> Duration {
        self.heartbeat
    }

    /// `T`: how long a leader goes without a majority before it stops leading, and the
    /// shortest wait of a follower's election timer.
    pub fn election_timeout(self) -> Duration {
        self.election_timeout
    }

    /// How long a leader's heartbeat keeps a voter from voting for another node:
    /// openraft's leader lease (its longest election timeout), 1.5 `T`.
    pub fn leader_lease(self) -> Duration {
        self.election_timeout * 3 / 2
    }

    /// The timing of a running raft (from its configuration).
    pub fn of(config: &Config) -> Timing {
        let (heartbeat, election_timeout) = (
            Duration::from_millis(config.heartbeat_interval),
            Duration::from_millis(config.election_timeout_min),
        );
        debug_assert!(
            Timing::new(heartbeat, election_timeout).is_ok(),
            "a running raft's timing was checked when it was made"
        );
        Timing {
            heartbeat,
            election_timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_outside_their_ranges_are_refused_with_the_range() {
        let ms = Duration::from_millis;
        let t = Timing::new(ms(100), ms(400)).unwrap();
        assert_eq!(t, Timing::default());
        assert_eq!(t.leader_lease(), ms(600));
        assert_eq!(
            Timing::new(ms(10), ms(400)),
            Err("--cluster-heartbeat must be 20 to 1000 ms, not 10 ms".to_owned())
        );
        assert_eq!(
            Timing::new(ms(100), ms(250)),
            Err("--cluster-election-timeout must be 300 to 10000 ms (3 heartbeats at least), not 250 ms".to_owned())
        );
        assert_eq!(
            Timing::new(ms(100), ms(10_001)),
            Err("--cluster-election-timeout must be 300 to 10000 ms (3 heartbeats at least), not 10001 ms".to_owned())
        );
        assert!(Timing::new(ms(1_000), ms(3_000)).is_ok());
    }
}
