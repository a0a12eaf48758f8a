//! The disk alarm: like RabbitMQ's, musterd watches the free space of its data
//! directory's file system and, below a threshold, refuses enqueues (`disk_full`) while
//! it goes on serving claims, renewals, settles and operators' repairs, which let space
//! come back. The alarm lifts once free space is back above the threshold plus a
//! margin ([`LIFT_MARGIN_DIVISOR`]), so it does not flap around the threshold.
//!
//! The dispatcher checks every [`CHECK_INTERVAL`] and hands the engine the result: the
//! engine never reads the disk itself.

use std::path::PathBuf;
use std::time::Duration;

/// How often free space is read (one `statvfs`, a few microseconds): often enough
/// that a burst of enqueues cannot write through the margin between two checks.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// The alarm lifts at the threshold plus a quarter of it.
pub const LIFT_MARGIN_DIVISOR: u64 = 4;

/// Where the alarm goes off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Threshold {
    /// Free bytes below which enqueues are refused, whatever the file system's size.
    pub min_free_bytes: u64,
    /// Free space, in percent of the file system's size, below which enqueues are refused.
    pub min_free_percent: u8,
}

impl Threshold {
    /// The free bytes below which the alarm goes off on a file system of `total` bytes:
    /// the larger of the two limits.
    pub fn raise_below(&self, total: u64) -> u64 {
        let share = total / 100 * u64::from(self.min_free_percent);
        self.min_free_bytes.max(share)
    }

    /// Whether the alarm is on after a reading of `free` of `total` bytes, given whether
    /// it was on before.
    pub fn alarm(&self, was_on: bool, free: u64, total: u64) -> bool {
        let below = self.raise_below(total);
        if was_on {
            free < below + below / LIFT_MARGIN_DIVISOR
        } else {
            free < below
        }
    }
}

/// Free and total bytes of a file system, as an unprivileged process may use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes available to this process.
    pub free: u64,
    /// The file system's size.
    pub total: u64,
}

/// The alarm's state over the data directory.
pub struct DiskAlarm {
    dir: PathBuf,
    threshold: Threshold,
    on: bool,
}

impl DiskAlarm {
    /// An alarm over the file system of `dir`, off until the first reading.
    pub fn new(dir: PathBuf, threshold: Threshold) -> DiskAlarm {
        DiskAlarm {
            dir,
            threshold,
            on: false,
        }
    }

    /// Reads free space and updates the alarm (logging a change). Returns the reading and
    /// whether the alarm is on, or the error of the reading (the alarm then stays as it was).
    pub fn check(&mut self) -> std::io::Result<(Space, bool)> {
        let space = space(&self.dir)?;
        let on = self.threshold.alarm(self.on, space.free, space.total);
        let below = self.threshold.raise_below(space.total);
        if on && !self.on {
            tracing::warn!(
                free_bytes = space.free,
                threshold_bytes = below,
                dir = %self.dir.display(),
                "disk alarm: free space is below the threshold; enqueues are refused (disk_full) until it is back"
            );
        } else if !on && self.on {
            tracing::info!(
                free_bytes = space.free,
                threshold_bytes = below,
                "disk alarm lifted: enqueues are taken again"
            );
        }
        self.on = on;
        metrics::gauge!("muster_disk_free_bytes").set(space.free as f64);
        metrics::gauge!("muster_disk_alarm").set(if on { 1.0 } else { 0.0 });
        Ok((space, on))
    }
}

/// One line on the free space of `dir`'s file system, for an error that may come from a
/// full disk.
pub fn describe_space(dir: &std::path::Path) -> String {
    match space(dir) {
        Ok(Space { free, total }) => {
            format!("{} has {free} bytes free of {total}", dir.display())
        }
        Err(e) => format!("the free space of {} is unknown: {e}", dir.display()),
    }
}

fn space(dir: &std::path::Path) -> std::io::Result<Space> {
    let stat = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    let block = stat.fragment_size();
    Ok(Space {
        free: stat.blocks_available().saturating_mul(block),
        total: stat.blocks().saturating_mul(block),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alarm_goes_off_below_the_larger_limit_and_lifts_past_its_margin() {
        const MIB: u64 = 1 << 20;
        let t = Threshold {
            min_free_bytes: 100 * MIB,
            min_free_percent: 5,
        };
        // A small disk: the absolute limit counts; a large one: the share.
        assert_eq!(t.raise_below(1000 * MIB), 100 * MIB);
        assert_eq!(t.raise_below(10_000 * MIB), 500 * MIB);
        let total = 1000 * MIB;
        let steps = [
            (false, 101 * MIB, false),
            (false, 100 * MIB, false),
            (false, 100 * MIB - 1, true),
            // Still on until the margin (a quarter: 125 MiB) is free.
            (true, 110 * MIB, true),
            (true, 125 * MIB - 1, true),
            (true, 125 * MIB, false),
        ];
        for (was_on, free, on) in steps {
            assert_eq!(t.alarm(was_on, free, total), on, "{was_on} {free}");
        }
    }

    #[test]
    fn the_space_line_names_the_directory_and_its_free_and_total_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let Space { total, .. } = space(dir.path()).unwrap();
        let line = describe_space(dir.path());
        let rest = line
            .strip_prefix(&format!("{} has ", dir.path().display()))
            .unwrap_or_else(|| panic!("{line}"));
        let (free, of) = rest.split_once(" bytes free of ").unwrap();
        assert!(free.parse::<u64>().unwrap() <= total, "{line}");
        assert_eq!(of, total.to_string());

        let gone = dir.path().join("gone");
        let line = describe_space(&gone);
        assert!(
            line.starts_with(&format!(
                "the free space of {} is unknown: ",
                gone.display()
            )),
            "{line}"
        );
    }
}
