//! `task_find`: a search over one queue or every queue, by what tasks hold.
//!
//! The engine has one thread, so a search never examines more than a fixed amount per
//! request ([`MAX_FIND_SCAN`] index entries, [`MAX_FIND_READS`] records,
//! [`MAX_FIND_PAYLOAD_BYTES`] payload bytes) and answers with a cursor where it stopped.
//! Filters are applied cheapest first: the id prefix narrows the range of ids, state,
//! key and label are checked in memory, the idempotency key is one store lookup per
//! queue, and only then are records (error text) and payloads (text, fields) read.

use std::ops::{ControlFlow, RangeInclusive};

use ulid::Ulid;

use muster_protocol::limits::{
    MAX_FIND_PAYLOAD_BYTES, MAX_FIND_READS, MAX_FIND_SCAN, MAX_FIND_TEXT_BYTES, MAX_NAME_BYTES,
    MAX_PAGE,
};
use muster_protocol::model::{TaskState, TaskSummary};
use muster_protocol::names;
use muster_protocol::ops::{FieldMatch, FindCursor, TaskFind, TaskFindReply};

use super::ops::{bad, parse_id, summary};
use super::{Engine, Meta, OpResult, Queue, Waiter, state_index};
use crate::auth::Principal;
use crate::store::TaskRecord;

/// Crockford's base32 alphabet, in which ULIDs are written (and sort).
const ULID_ALPHABET: &str = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// Length of a ULID in text.
const ULID_CHARS: usize = 26;

/// A validated search.
struct Search {
    state: Option<TaskState>,
    /// The ids the prefix allows (all ids without one); `None` when no id can match.
    ids: Option<RangeInclusive<Ulid>>,
    key: Option<String>,
    idempotency_key: Option<String>,
    label: Option<String>,
    /// Lowercased, matched against the lowercased last error.
    error: Option<String>,
    payload: Option<String>,
    field: Option<(Vec<String>, serde_json::Value)>,
    newest_first: bool,
    limit: usize,
}

impl Search {
    fn reads_record(&self) -> bool {
        self.error.is_some()
    }

    fn reads_payload(&self) -> bool {
        self.payload.is_some() || self.field.is_some()
    }

    /// Whether a task's index entry matches the searched state, key and label.
    fn matches_meta(&self, meta: &Meta) -> bool {
        self.state.is_none_or(|s| s == meta.state)
            && self
                .key
                .as_deref()
                .is_none_or(|k| meta.key.as_deref() == Some(k))
            && self.label.as_ref().is_none_or(|l| meta.class.contains(l))
    }

    /// Whether a task's record matches the searched last error and idempotency key.
    fn matches_record(&self, rec: &TaskRecord) -> bool {
        let error_matches = self.error.as_deref().is_none_or(|needle| {
            rec.last_error
                .as_deref()
                .is_some_and(|e| e.to_ascii_lowercase().contains(needle))
        });
        let idem_matches = self
            .idempotency_key
            .as_deref()
            .is_none_or(|k| rec.idempotency_key.as_deref() == Some(k));
        error_matches && idem_matches
    }
}

/// What one request has done so far, against the limits.
#[derive(Default)]
struct Work {
    scanned: u64,
    reads: u64,
    payload_bytes: u64,
}

impl Work {
    fn exhausted(&self) -> bool {
        self.scanned >= MAX_FIND_SCAN
            || self.reads >= MAX_FIND_READS
            || self.payload_bytes >= MAX_FIND_PAYLOAD_BYTES
    }
}

/// What a search found so far: the matches, the work done, and where it is.
#[derive(Default)]
struct Found {
    tasks: Vec<TaskSummary>,
    work: Work,
    /// The last id examined, or the end of the last queue examined whole.
    position: Option<FindCursor>,
}

impl Found {
    /// The request's work is done, or the page is full.
    fn full(&self, limit: usize) -> bool {
        self.work.exhausted() || self.tasks.len() == limit
    }

    /// The reply: with a cursor where it is if the search `stopped` before its end.
    fn reply(self, stopped: bool) -> TaskFindReply {
        TaskFindReply {
            tasks: self.tasks,
            next: if stopped { self.position } else { None },
            scanned: self.work.scanned,
        }
    }
}

impl<W: Waiter> Engine<W> {
    /// Searches tasks: see `PROTOCOL.md` §5.35 and the module's doc for the cost.
    pub(super) fn task_find(
        &self,
        r: TaskFind,
        principal: Option<&Principal>,
    ) -> OpResult<TaskFindReply> {
        let search = validate(&r)?;
        let after = self.check_cursor(&r)?;
        let mut found = Found::default();
        for (name, queue) in self.searched_queues(&r, principal, search.newest_first) {
            // Queues before the cursor's are done; ids in its own queue continue past it.
            let mut range = search.ids.clone();
            if let Some((after_queue, after_id)) = after {
                let passed = if search.newest_first {
                    name.as_str() > after_queue
                } else {
                    name.as_str() < after_queue
                };
                if passed {
                    continue;
                }
                if name == after_queue {
                    range = range.and_then(|r| past(r, after_id, search.newest_first));
                }
            }
            if self
                .search_queue(name, queue, &search, range, &mut found)?
                .is_break()
            {
                return Ok(found.reply(true));
            }
        }
        Ok(found.reply(false))
    }

    /// Checks the search's queue and cursor: the queue exists, and the cursor is in it.
    /// Returns the cursor's queue and id.
    fn check_cursor<'r>(&self, r: &'r TaskFind) -> OpResult<Option<(&'r str, Ulid)>> {
        if let Some(q) = &r.queue {
            self.index.queue(q)?;
        }
        if let (Some(q), Some(after)) = (&r.queue, &r.after)
            && after.queue != *q
        {
            return Err(bad(format!(
                "cursor is in queue {:?}, not in the searched queue {q:?}",
                after.queue
            )));
        }
        match &r.after {
            Some(c) => {
                names::check_queue(&c.queue).map_err(bad)?;
                Ok(Some((c.queue.as_str(), parse_id(&c.id)?)))
            }
            None => Ok(None),
        }
    }

    /// The queues a search looks in, in its order: the one it names, or every queue
    /// the principal covers.
    fn searched_queues(
        &self,
        r: &TaskFind,
        principal: Option<&Principal>,
        newest_first: bool,
    ) -> Vec<(&String, &Queue)> {
        let mut queues: Vec<(&String, &Queue)> = match &r.queue {
            Some(name) => self.index.queues.get_key_value(name).into_iter().collect(),
            None => self
                .index
                .queues
                .iter()
                .filter(|(name, _)| principal.is_none_or(|p| p.covers(name)))
                .collect(),
        };
        if newest_first {
            queues.reverse();
        }
        queues
    }

    /// Examines the candidates of one queue within `range` (none when no id of it can
    /// match). Breaks when the request's work or the page is full: the cursor is then
    /// the last id examined.
    fn search_queue(
        &self,
        name: &str,
        queue: &Queue,
        search: &Search,
        range: Option<RangeInclusive<Ulid>>,
        found: &mut Found,
    ) -> OpResult<ControlFlow<()>> {
        if found.full(search.limit) {
            return Ok(ControlFlow::Break(()));
        }
        found.work.scanned += 1;
        if let Some(range) = range {
            debug_assert!(
                !range.is_empty(),
                "queue {name:?}: a range searched holds an id"
            );
            for id in self.candidates(name, queue, search, range, &mut found.work)? {
                if found.full(search.limit) {
                    return Ok(ControlFlow::Break(()));
                }
                found.position = Some(FindCursor {
                    queue: name.to_owned(),
                    id: id.to_string(),
                });
                if let Some(task) = self.examine(id, search, &mut found.work)? {
                    found.tasks.push(task);
                }
                assert!(
                    found.tasks.len() <= search.limit,
                    "a search finds at most its limit"
                );
            }
        }
        // The whole queue was examined: the cursor moves past its last possible id.
        let end = if search.newest_first {
            Ulid::nil()
        } else {
            Ulid(u128::MAX)
        };
        found.position = Some(FindCursor {
            queue: name.to_owned(),
            id: end.to_string(),
        });
        Ok(ControlFlow::Continue(()))
    }

    /// The ids of one queue a search examines, in its order, within `range`.
    fn candidates<'a>(
        &'a self,
        name: &str,
        queue: &'a Queue,
        search: &Search,
        range: RangeInclusive<Ulid>,
        work: &mut Work,
    ) -> OpResult<Box<dyn Iterator<Item = Ulid> + 'a>> {
        if let Some(idem) = &search.idempotency_key {
            // One lookup finds the only task that can match in this queue.
            work.reads += 1;
            let found = self
                .store
                .idem(name, idem)?
                .filter(|id| range.contains(id) && self.index.tasks.contains_key(id));
            debug_assert!(
                found.is_none_or(|id| *self.index.tasks[&id].queue == *name),
                "queue {name:?}: an idempotency key names a task of its own queue"
            );
            return Ok(Box::new(found.into_iter()));
        }
        let newest_first = search.newest_first;
        let states: Vec<TaskState> = match search.state {
            Some(s) => vec![s],
            None => TaskState::ALL.to_vec(),
        };
        let parts = states
            .into_iter()
            .map(|s| {
                let ids = queue.by_state[state_index(s)].range(range.clone()).copied();
                let part: Box<dyn Iterator<Item = Ulid> + 'a> = if newest_first {
                    Box::new(ids.rev())
                } else {
                    Box::new(ids)
                };
                part.peekable()
            })
            .collect();
        Ok(Box::new(Merged {
            parts,
            newest_first,
        }))
    }

    /// Checks one candidate against the search; its summary if it matches.
    fn examine(&self, id: Ulid, search: &Search, work: &mut Work) -> OpResult<Option<TaskSummary>> {
        work.scanned += 1;
        let Some(meta) = self.index.tasks.get(&id) else {
            unreachable!("task {id} is indexed in its queue but not known");
        };
        debug_assert!(
            self.index.queues[&*meta.queue]
                .ids(meta.state)
                .contains(&id),
            "task {id}: a candidate is listed under its state in its queue"
        );
        assert!(
            meta.held.is_some() == (meta.state == TaskState::Leased),
            "task {id}: a lease clock exactly while leased"
        );
        if !search.matches_meta(meta) {
            return Ok(None);
        }
        work.reads += 1;
        // The record is read first only when it is searched; otherwise only for a task
        // whose payload matched.
        let searched = if search.reads_record() || search.idempotency_key.is_some() {
            let rec = self.record(id)?;
            if !search.matches_record(&rec) {
                return Ok(None);
            }
            Some(rec)
        } else {
            None
        };
        if search.reads_payload() && !self.payload_matches(id, search, work)? {
            return Ok(None);
        }
        let rec = match searched {
            Some(rec) => rec,
            None => self.record(id)?,
        };
        Ok(Some(summary(id, &rec)))
    }

    /// Whether a task's payload holds the searched text and field value (read, and
    /// counted against the request's limit).
    fn payload_matches(&self, id: Ulid, search: &Search, work: &mut Work) -> OpResult<bool> {
        let payload = self.payload(id)?;
        let text = payload.get();
        work.payload_bytes += text.len() as u64;
        if search
            .payload
            .as_deref()
            .is_some_and(|needle| !text.contains(needle))
        {
            return Ok(false);
        }
        if let Some((path, value)) = &search.field
            && !field_equals(text, path, value)
        {
            return Ok(false);
        }
        Ok(true)
    }
}

/// Several id-ordered iterators merged into one, in ascending or descending order.
struct Merged<'a> {
    parts: Vec<std::iter::Peekable<Box<dyn Iterator<Item = Ulid> + 'a>>>,
    newest_first: bool,
}

impl Iterator for Merged<'_> {
    type Item = Ulid;

    fn next(&mut self) -> Option<Ulid> {
        let newest_first = self.newest_first;
        let mut best: Option<(usize, Ulid)> = None;
        for (i, part) in self.parts.iter_mut().enumerate() {
            if let Some(&id) = part.peek() {
                let better = best.is_none_or(|(_, b)| if newest_first { id > b } else { id < b });
                if better {
                    best = Some((i, id));
                }
            }
        }
        let (i, id) = best?;
        let taken = self.parts[i].next();
        assert_eq!(taken, Some(id), "a peeked id is the next one");
        taken
    }
}

/// The part of `range` after `cursor` in the search's order; `None` if nothing is left.
fn past(
    range: RangeInclusive<Ulid>,
    cursor: Ulid,
    newest_first: bool,
) -> Option<RangeInclusive<Ulid>> {
    let (lo, hi) = range.into_inner();
    let (lo, hi) = if newest_first {
        (lo, hi.min(Ulid(cursor.0.checked_sub(1)?)))
    } else {
        (lo.max(Ulid(cursor.0.checked_add(1)?)), hi)
    };
    let rest = (lo <= hi).then_some(lo..=hi);
    debug_assert!(
        rest.as_ref().is_none_or(|r| !r.contains(&cursor)),
        "a search goes on past its cursor, never at it again"
    );
    rest
}

fn validate(r: &TaskFind) -> OpResult<Search> {
    let limit = r.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_PAGE {
        return Err(bad(format!("limit {limit} is outside 1..={MAX_PAGE}")));
    }
    if let Some(q) = &r.queue {
        names::check_queue(q).map_err(bad)?;
    }
    for (what, value, max) in [
        ("key", &r.key, MAX_NAME_BYTES),
        ("idempotency key", &r.idempotency_key, MAX_NAME_BYTES),
        ("error text", &r.error, MAX_FIND_TEXT_BYTES),
        ("payload text", &r.payload, MAX_FIND_TEXT_BYTES),
    ] {
        if let Some(v) = value
            && (v.is_empty() || v.len() > max)
        {
            return Err(bad(format!("{what} must be 1 to {max} bytes")));
        }
    }
    if let Some(label) = &r.label {
        names::check_labels(std::slice::from_ref(label)).map_err(bad)?;
    }
    Ok(Search {
        state: r.state,
        ids: match &r.id_prefix {
            Some(p) => prefix_range(p)?,
            None => Some(Ulid::nil()..=Ulid(u128::MAX)),
        },
        key: r.key.clone(),
        idempotency_key: r.idempotency_key.clone(),
        label: r.label.clone(),
        error: r.error.as_deref().map(str::to_ascii_lowercase),
        payload: r.payload.clone(),
        field: r.field.as_ref().map(field_path).transpose()?,
        newest_first: r.newest_first,
        limit: limit as usize,
    })
}

/// The ids that start with `prefix`: ULID text sorts as the ids do, so a prefix is a
/// range, from the prefix padded with the lowest digit to it padded with the highest.
fn prefix_range(prefix: &str) -> OpResult<Option<RangeInclusive<Ulid>>> {
    let prefix = prefix.to_ascii_uppercase();
    if prefix.is_empty()
        || prefix.len() > ULID_CHARS
        || !prefix.chars().all(|c| ULID_ALPHABET.contains(c))
    {
        return Err(bad(format!(
            "id prefix {prefix:?} is not 1 to {ULID_CHARS} characters of a task id"
        )));
    }
    let pad = |digit: char| {
        let mut text = prefix.clone();
        text.extend(std::iter::repeat_n(digit, ULID_CHARS - prefix.len()));
        text
    };
    // A ULID's first character is at most 7 (128 bits in 130): past it nothing matches.
    if prefix.as_bytes()[0] > b'7' {
        return Ok(None);
    }
    let lo = Ulid::from_string(&pad('0')).map_err(|e| bad(format!("id prefix {prefix:?}: {e}")))?;
    let hi = Ulid::from_string(&pad('Z')).map_err(|e| bad(format!("id prefix {prefix:?}: {e}")))?;
    debug_assert!(lo <= hi, "id prefix {prefix:?}: a non-empty range of ids");
    Ok(Some(lo..=hi))
}

fn field_path(f: &FieldMatch) -> OpResult<(Vec<String>, serde_json::Value)> {
    if f.path.is_empty()
        || f.path.len() > MAX_FIND_TEXT_BYTES
        || f.path.split('.').any(str::is_empty)
    {
        return Err(bad(format!(
            "field path {:?} is not 1 to {MAX_FIND_TEXT_BYTES} bytes of dot-separated names",
            f.path
        )));
    }
    Ok((
        f.path.split('.').map(str::to_owned).collect(),
        f.value.clone(),
    ))
}

/// Whether the payload has `value` at `path` (object keys, or indexes into arrays).
fn field_equals(payload: &str, path: &[String], value: &serde_json::Value) -> bool {
    let Ok(mut at) = serde_json::from_str::<serde_json::Value>(payload) else {
        return false;
    };
    for step in path {
        at = match at {
            serde_json::Value::Object(mut map) => match map.remove(step) {
                Some(v) => v,
                None => return false,
            },
            serde_json::Value::Array(mut items) => match step.parse::<usize>() {
                Ok(i) if i < items.len() => items.swap_remove(i),
                _ => return false,
            },
            _ => return false,
        };
    }
    at == *value || (at.is_number() && value.is_number() && at.as_f64() == value.as_f64())
}

#[cfg(test)]
mod tests {
    use super::{field_equals, prefix_range};
    use serde_json::json;
    use ulid::Ulid;

    #[test]
    fn a_prefix_is_the_range_of_ids_that_start_with_it() {
        let id = Ulid::from_string("01JHMPFNMW1HEAD8X4A1JH69RE").unwrap();
        let range = prefix_range("01jhmp").unwrap().unwrap();
        assert!(range.contains(&id));
        assert_eq!(range.start().to_string(), "01JHMP00000000000000000000");
        assert_eq!(range.end().to_string(), "01JHMPZZZZZZZZZZZZZZZZZZZZ");
        assert_eq!(prefix_range("8").unwrap(), None);
        assert_eq!(prefix_range("7").unwrap().unwrap().end(), &Ulid(u128::MAX));
        assert!(prefix_range("01I").is_err());
        assert!(prefix_range("").is_err());
        assert!(prefix_range(&"0".repeat(27)).is_err());
    }

    #[test]
    fn fields_are_found_by_key_and_index_and_numbers_by_value() {
        let payload = r#"{"order":{"id":42,"lines":[{"sku":"a-1"},{"sku":"b-2"}]},"x":null}"#;
        let path = |p: &str| p.split('.').map(str::to_owned).collect::<Vec<_>>();
        assert!(field_equals(payload, &path("order.id"), &json!(42)));
        assert!(field_equals(payload, &path("order.id"), &json!(42.0)));
        assert!(!field_equals(payload, &path("order.id"), &json!("42")));
        assert!(field_equals(
            payload,
            &path("order.lines.1.sku"),
            &json!("b-2")
        ));
        assert!(!field_equals(
            payload,
            &path("order.lines.2.sku"),
            &json!("b-2")
        ));
        assert!(field_equals(payload, &path("x"), &json!(null)));
        assert!(!field_equals(payload, &path("y"), &json!(null)));
        assert!(!field_equals(payload, &path("order.id.deeper"), &json!(42)));
    }
}
