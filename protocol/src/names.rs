//! Validation of names and labels, shared by the daemon (which enforces) and clients
//! (which fail early with the same message).

use crate::limits::{
    MAX_LABEL_BYTES, MAX_LABELS, MAX_NAME_BYTES, MAX_SCHEDULE_NAME_BYTES, MAX_TRACESTATE_BYTES,
};

/// Checks a queue name: `[a-z0-9][a-z0-9._-]{0,127}`.
pub fn check_queue(name: &str) -> Result<(), String> {
    check_object_name("queue", name, MAX_NAME_BYTES)
}

/// Checks a limit name: the queue-name rules, `[a-z0-9][a-z0-9._-]{0,127}`.
pub fn check_limit(name: &str) -> Result<(), String> {
    check_object_name("limit", name, MAX_NAME_BYTES)
}

/// Checks a schedule name: `[a-z0-9][a-z0-9._-]{0,99}` (shorter than a queue's: the
/// idempotency key of each task it enqueues carries it, see
/// [`crate::limits::MAX_SCHEDULE_NAME_BYTES`]).
pub fn check_schedule(name: &str) -> Result<(), String> {
    check_object_name("schedule", name, MAX_SCHEDULE_NAME_BYTES)
}

/// Checks the name of a named object (a queue, a limit, a schedule):
/// `[a-z0-9][a-z0-9._-]*`, 1 to `most` bytes.
fn check_object_name(what: &str, name: &str, most: usize) -> Result<(), String> {
    let bytes = name.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= most
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid {what} name {name:?}: want [a-z0-9][a-z0-9._-]{{0,{}}}",
            most - 1
        ))
    }
}

/// Checks a task's W3C trace context: `traceparent` as version 00 writes it
/// (`00-` 32 lowercase hex digits of trace id, `-` 16 of parent span id, `-` 2 of
/// flags; neither id all zeros), and `tracestate`, only beside a `traceparent`, at most
/// [`MAX_TRACESTATE_BYTES`] of printable ASCII.
pub fn check_trace(traceparent: Option<&str>, tracestate: Option<&str>) -> Result<(), String> {
    let Some(tp) = traceparent else {
        return match tracestate {
            Some(_) => Err("a tracestate needs a traceparent".into()),
            None => Ok(()),
        };
    };
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let parts: Vec<&str> = tp.split('-').collect();
    let ok = matches!(
        parts.as_slice(),
        [version, trace, span, flags]
            if *version == "00"
                && trace.len() == 32 && hex(trace) && trace.bytes().any(|b| b != b'0')
                && span.len() == 16 && hex(span) && span.bytes().any(|b| b != b'0')
                && flags.len() == 2 && hex(flags)
    );
    if !ok {
        return Err(format!(
            "invalid traceparent {tp:?}: want 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, lowercase, ids not all zeros"
        ));
    }
    if let Some(ts) = tracestate {
        if ts.len() > MAX_TRACESTATE_BYTES {
            return Err(format!(
                "a tracestate is at most {MAX_TRACESTATE_BYTES} bytes, not {}",
                ts.len()
            ));
        }
        if !ts.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err("a tracestate is printable ASCII".into());
        }
    }
    Ok(())
}

/// Checks a member name: `[A-Za-z0-9._:/@-]{1,128}`.
pub fn check_member(name: &str) -> Result<(), String> {
    let bytes = name.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= MAX_NAME_BYTES
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/@-".contains(b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid member name {name:?}: want [A-Za-z0-9._:/@-]{{1,128}}"
        ))
    }
}

/// Checks a label list: at most 32 labels of `[A-Za-z0-9._:/=-]{1,64}`.
pub fn check_labels(labels: &[String]) -> Result<(), String> {
    if labels.len() > MAX_LABELS {
        return Err(format!(
            "{} labels exceed the limit of {MAX_LABELS}",
            labels.len()
        ));
    }
    for label in labels {
        let bytes = label.as_bytes();
        let ok = !bytes.is_empty()
            && bytes.len() <= MAX_LABEL_BYTES
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || b"._:/=-".contains(b));
        if !ok {
            return Err(format!(
                "invalid label {label:?}: want [A-Za-z0-9._:/=-]{{1,{MAX_LABEL_BYTES}}}"
            ));
        }
    }
    Ok(())
}

/// Checks a free-form short string (task key, idempotency key): 1 to 128 bytes, no control characters.
pub fn check_short(what: &str, value: &str) -> Result<(), String> {
    if value.is_empty() || value.len() > MAX_NAME_BYTES || value.chars().any(char::is_control) {
        return Err(format!(
            "invalid {what} {value:?}: want 1 to {MAX_NAME_BYTES} bytes without control characters"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names() {
        for good in ["jobs", "a", "0", "gpu.jobs-2_x", &"a".repeat(128)] {
            assert_eq!(check_queue(good), Ok(()), "{good}");
        }
        for bad in ["", "Jobs", "-a", ".a", "a b", "a/b", &"a".repeat(129), "é"] {
            assert!(check_queue(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn member_names_and_labels() {
        assert_eq!(check_member("gpu-3/agent-7@host:1"), Ok(()));
        assert!(check_member("").is_err());
        assert!(check_member("a b").is_err());
        assert_eq!(check_labels(&["gpu".into(), "model=llama".into()]), Ok(()));
        assert!(check_labels(&["".into()]).is_err());
        assert!(check_labels(&vec!["x".to_string(); 33]).is_err());
        assert!(check_short("key", "a\nb").is_err());
        assert_eq!(check_short("key", "order-42"), Ok(()));
    }
}
