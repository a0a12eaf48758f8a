//! The search language of `/`: its words (`id:`, `key:`, `error:`, …), what they
//! become as a `task_find` request, and what a search found so far.

use muster_protocol::model::{TaskState, TaskSummary};
use muster_protocol::ops::{FieldMatch, FindCursor, TaskFind};

use super::screen::PAGE_ROWS;

/// What a search found so far, newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Found {
    /// The matches, in search order.
    pub tasks: Vec<TaskSummary>,
    /// Where the search goes on; `None` once every task was examined.
    pub next: Option<FindCursor>,
    /// Tasks examined so far.
    pub scanned: u64,
    /// The search stopped with a full page although more may match (`]` goes on).
    pub more: bool,
}

/// The words a search may hold, each `NAME:TEXT`.
const SEARCH_WORDS: [&str; 8] = [
    "id", "key", "idem", "label", "state", "error", "payload", "field",
];

/// Splits what was typed after `/` into its words: `(NAME, TEXT)`, NAME `""` for bare
/// text before the first word. A word's TEXT runs to the next `NAME:` of a search word,
/// spaces and all (`error:timed out`), trimmed at both ends; so does bare text (one
/// phrase, not a word each). A word is named once. An unknown `NAME:` (letters only)
/// at the start is refused as a likely typo; after a word it is part of its text
/// (`error:refused by host:443`).
pub fn search_words(text: &str) -> Result<Vec<(&str, &str)>, String> {
    // (name, where its text starts, where it ends so far)
    let mut words: Vec<(&str, usize, usize)> = Vec::new();
    let mut at = 0;
    for piece in text.split_whitespace() {
        let start = at + text[at..].find(piece).expect("a piece of the text");
        at = start + piece.len();
        let named = piece
            .split_once(':')
            .filter(|(name, _)| SEARCH_WORDS.contains(name));
        match (named, words.last_mut()) {
            (Some((name, _)), _) => {
                if words.iter().any(|(n, _, _)| *n == name) {
                    return Err(format!("{name}: is given twice"));
                }
                words.push((name, start + name.len() + 1, at));
            }
            (None, Some(last)) => last.2 = at,
            (None, None) => {
                if let Some((name, _)) = piece.split_once(':')
                    && !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_alphabetic())
                {
                    return Err(format!("unknown search word {name}: (? lists them)"));
                }
                words.push(("", start, at));
            }
        }
    }
    words
        .into_iter()
        .map(|(name, start, end)| {
            let value = text[start..end.max(start)].trim();
            if value.is_empty() {
                Err(format!("nothing after {name}:"))
            } else {
                Ok((name, value))
            }
        })
        .collect()
}

/// Turns what was typed after `/` into a search (the words of [`search_words`]):
/// `id:PREFIX`, `key:K`, `idem:K`, `label:L`, `error:TEXT`, `payload:TEXT`,
/// `state:STATE`, `field:PATH=VALUE`; bare text is an id prefix if it can be one
/// (one word of Crockford base32), else payload text.
pub fn search_query(queue: Option<String>, text: &str) -> Result<TaskFind, String> {
    let mut search = TaskFind {
        queue,
        newest_first: true,
        limit: Some(PAGE_ROWS),
        ..TaskFind::default()
    };
    if text.trim().is_empty() {
        return Err(
            "type what to search for: an id prefix, key:K, error:TEXT, … (? for all)".into(),
        );
    }
    for (name, value) in search_words(text)? {
        let one_word = |what: &str| {
            if value.contains(char::is_whitespace) {
                Err(format!("{what} has no spaces: {value:?}"))
            } else {
                Ok(value.to_owned())
            }
        };
        let set = |slot: &mut Option<String>| {
            if slot.is_some() {
                return Err("payload text is given twice (bare text is payload text)".to_owned());
            }
            *slot = Some(value.to_owned());
            Ok(())
        };
        match name {
            "id" => search.id_prefix = Some(one_word("an id prefix")?),
            "key" => search.key = Some(value.to_owned()),
            "idem" => search.idempotency_key = Some(value.to_owned()),
            "label" => search.label = Some(one_word("a label")?),
            "error" => search.error = Some(value.to_owned()),
            "payload" => set(&mut search.payload)?,
            "state" => {
                search.state = Some(
                    TaskState::parse(value).ok_or_else(|| format!("unknown state {value:?}"))?,
                )
            }
            "field" => {
                let (path, v) = value
                    .split_once('=')
                    .ok_or_else(|| format!("want field:PATH=VALUE, not {value:?}"))?;
                search.field = Some(FieldMatch {
                    path: path.trim().to_owned(),
                    value: serde_json::from_str(v.trim()).unwrap_or_else(|_| v.trim().into()),
                });
            }
            _ if is_id_prefix(value) => search.id_prefix = Some(value.to_owned()),
            _ => set(&mut search.payload)?,
        }
    }
    Ok(search)
}

/// Whether `text` can begin a task id (two or more characters of Crockford base32).
fn is_id_prefix(text: &str) -> bool {
    text.len() >= 2
        && text.len() <= 26
        && text
            .to_ascii_uppercase()
            .chars()
            .all(|c| "0123456789ABCDEFGHJKMNPQRSTVWXYZ".contains(c))
}
