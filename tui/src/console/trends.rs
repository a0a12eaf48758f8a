//! Each queue's rates and trend graphs, the console's own: kept from the totals the
//! watched screens push anyway, averaged over a window (rates) or second by second
//! (trends).

use std::collections::VecDeque;

use muster_protocol::model::QueueTotals;

/// The totals of a queue as seen over the last [`RATE_WINDOW_MS`]: rates are the change
/// from the oldest to the newest, so bursts of acks do not make the numbers jump.
#[derive(Debug, Clone, Default)]
pub(super) struct Rate {
    samples: VecDeque<(u64, QueueTotals)>,
}

/// The span rates are averaged over.
const RATE_WINDOW_MS: u64 = 10_000;

impl Rate {
    pub(super) fn note(&mut self, at_ms: u64, totals: QueueTotals) {
        if self.samples.back().is_some_and(|(last, _)| *last >= at_ms) {
            return;
        }
        self.samples.push_back((at_ms, totals));
        // Keep the newest sample at or before the window's start, and all after it.
        let start = at_ms.saturating_sub(RATE_WINDOW_MS);
        while self.samples.get(1).is_some_and(|(t, _)| *t <= start) {
            self.samples.pop_front();
        }
    }

    /// Enqueued and acked per second over the window ending `now`. A watched screen is
    /// pushed whenever anything changed, so no sample since the last means no change.
    pub(super) fn per_second(&self, now: u64) -> (f64, f64) {
        let Some((_, last)) = self.samples.back() else {
            return (0.0, 0.0);
        };
        let start = now.saturating_sub(RATE_WINDOW_MS);
        let base = self
            .samples
            .iter()
            .rev()
            .find(|(t, _)| *t <= start)
            .or(self.samples.front());
        let Some((t0, first)) = base else {
            return (0.0, 0.0);
        };
        let span = now.saturating_sub(*t0);
        if span < 1000 {
            return (0.0, 0.0);
        }
        let span = span as f64 / 1000.0;
        let per_s = |a: u64, b: u64| a.saturating_sub(b) as f64 / span;
        (
            per_s(last.enqueued, first.enqueued),
            per_s(last.acked, first.acked),
        )
    }
}

/// Seconds of history kept per queue for its trend graphs: the last two minutes, one
/// sample a second (a few KiB per queue).
pub const TREND_SECONDS: usize = 120;

/// A queue's totals and ready count, second by second, for the last [`TREND_SECONDS`].
/// A second with no sample had no change (a watched screen is pushed on every change).
#[derive(Debug, Clone, Default)]
pub(super) struct Trend {
    /// (second, enqueued total, acked total, ready), oldest first, one per second.
    samples: VecDeque<(u64, u64, u64, u64)>,
}

/// A queue's recent history, one value a second, oldest first, ending at the current
/// second: enqueued and acked in each second, and the ready count at its end. `None`
/// where the console did not know yet (before its first sample of the queue; for the
/// rates, also that sample's second, which has nothing to count from).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrendSeries {
    /// Tasks enqueued in each second.
    pub enqueued: Vec<Option<u64>>,
    /// Tasks acked in each second.
    pub acked: Vec<Option<u64>>,
    /// Ready tasks at the end of each second.
    pub ready: Vec<Option<u64>>,
}

impl Trend {
    pub(super) fn note(&mut self, at_ms: u64, totals: QueueTotals, ready: u64) {
        let second = at_ms / 1000;
        let sample = (second, totals.enqueued, totals.acked, ready);
        match self.samples.back_mut() {
            // The latest of a second stands for it.
            Some(last) if last.0 == second => *last = sample,
            Some(last) if last.0 > second => return,
            _ => self.samples.push_back(sample),
        }
        let oldest = second.saturating_sub(TREND_SECONDS as u64);
        // Keep one sample at or before the window: the base of its first second.
        while self.samples.get(1).is_some_and(|s| s.0 <= oldest) {
            self.samples.pop_front();
        }
    }

    pub(super) fn series(&self, now_ms: u64) -> TrendSeries {
        let now = now_ms / 1000;
        let mut out = TrendSeries::default();
        let mut at = 0;
        let mut last: Option<(u64, u64, u64, u64)> = None;
        let start = (now + 1).saturating_sub(TREND_SECONDS as u64);
        // The samples before the window are the base of its first second.
        while let Some(s) = self.samples.get(at).filter(|s| s.0 < start) {
            last = Some(*s);
            at += 1;
        }
        for second in start..=now {
            let before = last;
            while let Some(s) = self.samples.get(at).filter(|s| s.0 <= second) {
                last = Some(*s);
                at += 1;
            }
            let (enqueued, acked) = match (before, last) {
                (Some(b), Some(l)) => {
                    (Some(l.1.saturating_sub(b.1)), Some(l.2.saturating_sub(b.2)))
                }
                _ => (None, None),
            };
            out.enqueued.push(enqueued);
            out.acked.push(acked);
            out.ready.push(last.map(|l| l.3));
        }
        out
    }
}
