//! The limits screen's words and bars: how a limit's rate reads, the bucket its bars
//! show (its one bucket, or a per-key limit's busiest key), the gauges of tokens
//! against the burst and of leases held against the concurrency, and what is worth
//! saying of a key (how long its throttle lasts, when its bucket is full again).
//! Shared by the rows (what `s` sorts by) and the renderer.

use muster_protocol::model::{LimitInfo, LimitKeyInfo, Rate};

use super::detail::short;
use super::ui::count;

/// A rate as `muster limit list` shows it, `COUNT/PERIOD` (`500/1m`); `-` for none.
pub fn rate_text(rate: Option<Rate>) -> String {
    rate.map_or("-".into(), |r| {
        format!("{}/{}", r.count, crate::output::span(r.per_ms))
    })
}

/// What a [`Gauge`] measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// Tokens in a bucket, against the burst: empty is the end where tasks wait.
    Tokens,
    /// Leases held, against the concurrency: full is the end where tasks wait.
    Leases,
}

/// A level against its most: tokens against the burst, or leases held against the
/// concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gauge {
    /// What it measures.
    pub measure: Measure,
    /// The level now.
    pub value: u64,
    /// The most it can be (at least 1: the daemon refuses a burst or concurrency of 0).
    pub max: u64,
}

impl Gauge {
    /// Nothing left to hand out: no token, or every lease the concurrency allows held.
    pub fn exhausted(self) -> bool {
        match self.measure {
            Measure::Tokens => self.value == 0,
            Measure::Leases => self.value >= self.max,
        }
    }

    /// Thousandths of the most (at most 1000): what `s` sorts a bar's column by.
    pub fn permille(self) -> u64 {
        let value = u128::from(self.value.min(self.max));
        u64::try_from(value * 1000 / u128::from(self.max.max(1))).unwrap_or(1000)
    }

    /// `VALUE/MAX`, each as a count is shown (`250/500`, `12.5k/20k`).
    pub fn label(self) -> String {
        format!("{}/{}", count(self.value), count(self.max))
    }

    /// The bar, `width` cells of `█` (the level) then `░` (the rest), rounded to
    /// whole cells, except that a level above nothing shows at least one cell and a
    /// level short of the most leaves at least one empty (given two cells or more).
    pub fn bar(self, width: usize) -> String {
        let max = u128::from(self.max.max(1));
        let value = u128::from(self.value.min(self.max));
        let rounded = (value * width as u128 + max / 2) / max;
        let rounded = usize::try_from(rounded).unwrap_or(width).min(width);
        let filled = if width >= 2 && value > 0 && value < max {
            rounded.clamp(1, width - 1)
        } else {
            rounded
        };
        debug_assert!(filled <= width, "a bar fills at most its width");
        format!("{}{}", "█".repeat(filled), "░".repeat(width - filled))
    }

    /// The bar and its label right-aligned in `label_width` columns, `width` columns in
    /// all; just the label where there is no room for a bar of two cells.
    pub fn meter(self, width: u16, label_width: usize) -> String {
        let width = usize::from(width);
        let label = self.label();
        match width.checked_sub(label_width + 1) {
            Some(bar) if bar >= 2 => format!("{} {label:>label_width$}", self.bar(bar)),
            _ => label,
        }
    }
}

/// The bucket a limit's bars show: its one bucket, or a per-key limit's busiest key
/// (most leases held, then most tasks waiting: the first the daemon lists); `None`
/// when none is in use (every bucket full, nothing held, nothing waiting).
pub fn shown_bucket(l: &LimitInfo) -> Option<&LimitKeyInfo> {
    l.keys.first()
}

/// The burst of a limit with a rate (the rate's count where the daemon left it out).
fn burst(l: &LimitInfo) -> Option<u64> {
    let rate = l.spec.rate?;
    Some(l.spec.burst.unwrap_or(rate.count))
}

/// Tokens in the bucket the bars show, against the burst; `None` without a rate. A
/// bucket not in use is full.
pub fn tokens(l: &LimitInfo) -> Option<Gauge> {
    let max = burst(l)?;
    let value = match shown_bucket(l) {
        Some(k) => k.tokens?,
        None => max,
    };
    Some(Gauge {
        measure: Measure::Tokens,
        value,
        max,
    })
}

/// Leases held against the concurrency, `None` without one: of a per-key limit, those
/// of the bucket the bars show (the concurrency is each key's); else all of them.
pub fn in_use(l: &LimitInfo) -> Option<Gauge> {
    let max = u64::from(l.spec.concurrency?);
    let value = if l.spec.per_key {
        shown_bucket(l).map_or(0, |k| k.held)
    } else {
        l.held
    };
    Some(Gauge {
        measure: Measure::Leases,
        value,
        max,
    })
}

/// Key `k`'s tokens against its limit's burst; `None` without a rate.
pub fn key_tokens(l: &LimitInfo, k: &LimitKeyInfo) -> Option<Gauge> {
    Some(Gauge {
        measure: Measure::Tokens,
        value: k.tokens?,
        max: burst(l)?,
    })
}

/// Key `k`'s leases held against its limit's concurrency; `None` without one.
pub fn key_in_use(l: &LimitInfo, k: &LimitKeyInfo) -> Option<Gauge> {
    Some(Gauge {
        measure: Measure::Leases,
        value: k.held,
        max: u64::from(l.spec.concurrency?),
    })
}

/// A key as shown: `(all)` for the one bucket of a limit that is not per key.
pub fn key_name(k: &LimitKeyInfo) -> &str {
    if k.key.is_empty() { "(all)" } else { &k.key }
}

/// What is worth saying of key `k` at `now`: `throttled 12s` while a holder's
/// throttle lasts, `full in 3s` while its bucket refills, both joined with ` · `;
/// `-` for neither.
pub fn key_notes(k: &LimitKeyInfo, now: u64) -> String {
    let mut notes = Vec::new();
    if let Some(until) = k.throttled_until_ms.filter(|t| *t > now) {
        notes.push(format!("throttled {}", short(until - now)));
    }
    if let Some(full) = k.full_ms.filter(|t| *t > now) {
        notes.push(format!("full in {}", short(full - now)));
    }
    if notes.is_empty() {
        "-".into()
    } else {
        notes.join(" · ")
    }
}

/// The line over a limit's keys: its settings, and how many keys are in use.
pub fn limit_facts(l: &LimitInfo) -> String {
    let mut facts = Vec::new();
    if let Some(rate) = l.spec.rate {
        let burst = l.spec.burst.unwrap_or(rate.count);
        facts.push(format!("rate {}, burst {burst}", rate_text(Some(rate))));
    }
    if let Some(c) = l.spec.concurrency {
        facts.push(format!("concurrency {c}"));
    }
    if l.spec.per_key {
        facts.push("each key its own".into());
        let shown = l.keys.len() as u64;
        facts.push(match l.keys_in_use {
            1 => "1 key in use".into(),
            n if n > shown => format!("{n} keys in use, the {shown} busiest shown"),
            n => format!("{n} keys in use"),
        });
    } else {
        facts.push("one bucket for every task".into());
    }
    facts.join(" · ")
}
