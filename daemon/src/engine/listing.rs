//! Pages of listed items bounded in count and in bytes, so no listing outgrows a frame.

use serde::Serialize;

use muster_protocol::limits::MAX_LISTING_BYTES;

/// The length of `value` as JSON, without building the text.
pub fn json_len<T: Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).expect("reply types serialize");
    count.0
}

/// A page: the items taken and the cursor of the next page, if more remain.
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

/// Takes up to `limit` items while their JSON fits [`MAX_LISTING_BYTES`] (the first is
/// always taken), computing no more than one item past the page. `cursor` names the
/// last item taken, for the next page.
pub fn fill<T: Serialize, E>(
    items: impl IntoIterator<Item = Result<T, E>>,
    limit: usize,
    cursor: impl Fn(&T) -> String,
) -> Result<Page<T>, E> {
    assert!(limit > 0, "a page holds at least one item");
    let mut taken: Vec<T> = Vec::new();
    let mut bytes = 0;
    for item in items {
        let item = item?;
        let len = json_len(&item);
        if taken.len() == limit || (!taken.is_empty() && bytes + len > MAX_LISTING_BYTES) {
            let next = taken.last().map(&cursor);
            return Ok(Page { items: taken, next });
        }
        bytes += len;
        taken.push(item);
        debug_assert!(
            taken.len() == 1 || bytes <= MAX_LISTING_BYTES,
            "a page of more than one item fits {MAX_LISTING_BYTES} bytes"
        );
    }
    Ok(Page {
        items: taken,
        next: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(items: Vec<String>) -> impl Iterator<Item = Result<String, ()>> {
        items.into_iter().map(Ok)
    }

    #[test]
    fn a_page_stops_at_its_limit_or_its_bytes_and_names_its_last_item() {
        let small: Vec<String> = (0..5).map(|i| format!("t{i}")).collect();
        let page = fill(ok(small.clone()), 3, Clone::clone).unwrap();
        assert_eq!(page.items, ["t0", "t1", "t2"]);
        assert_eq!(page.next.as_deref(), Some("t2"));
        let page = fill(ok(small), 5, Clone::clone).unwrap();
        assert_eq!(page.items.len(), 5);
        assert_eq!(page.next, None);

        // Items of a third of the budget: three do not fit, two do.
        let big: Vec<String> = (0..4)
            .map(|i| format!("{i}{}", "x".repeat(MAX_LISTING_BYTES / 3)))
            .collect();
        let page = fill(ok(big.clone()), 100, |s| s[..1].to_owned()).unwrap();
        assert_eq!(page.items.len(), 2);
        assert_eq!(page.next.as_deref(), Some("1"));
        assert!(json_len(&page.items) <= MAX_LISTING_BYTES);

        // One item over the budget alone still goes (a single task always fits a frame).
        let huge = vec!["y".repeat(MAX_LISTING_BYTES + 1), "z".into()];
        let page = fill(ok(huge), 100, |_| "c".into()).unwrap();
        assert_eq!(page.items.len(), 1);
        assert_eq!(page.next.as_deref(), Some("c"));
    }

    #[test]
    fn json_len_is_the_length_of_the_text() {
        let value = serde_json::json!({"a": "é\n\u{1}", "b": [1, 2, 3]});
        assert_eq!(json_len(&value), serde_json::to_vec(&value).unwrap().len());
    }
}
