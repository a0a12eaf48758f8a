//! How `null` reads in requests (PROTOCOL.md §1.5): in place of an optional number,
//! string or raw JSON value it means absent; for a boolean or an object it is refused.

use serde::{Deserialize, Deserializer};

/// An optional field that may be absent (with `#[serde(default)]`) but not `null`.
pub fn refused<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// An optional number whose `null` means absent: its default.
pub fn absent<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use crate::ops::decode_request;
    use crate::{ErrorCode, Request};

    fn decode(body: &str) -> Result<Request, ErrorCode> {
        decode_request(body.as_bytes())
            .map(|(_, r)| r)
            .map_err(|e| e.error.code)
    }

    #[test]
    fn null_is_absent_for_numbers_and_refused_for_booleans_and_objects() {
        let watch = r#"{"id":1,"op":"watch","view":{"screen":"queues"},"tag":null}"#;
        assert!(matches!(decode(watch), Ok(Request::Watch(w)) if w.tag == 0));
        let lease = r#"{"id":1,"op":"queue_update","queue":"q","options":{"lease_ms":null}}"#;
        assert!(decode(lease).is_ok());
        for field in ["paused", "retry_backoff"] {
            let body = format!(
                r#"{{"id":1,"op":"queue_update","queue":"q","options":{{"{field}":null}}}}"#
            );
            assert_eq!(decode(&body).err(), Some(ErrorCode::BadRequest), "{field}");
        }
        for field in ["field", "after"] {
            let body = format!(r#"{{"id":1,"op":"task_find","queue":"q","{field}":null}}"#);
            assert_eq!(decode(&body).err(), Some(ErrorCode::BadRequest), "{field}");
        }
        let find = r#"{"id":1,"op":"task_find","queue":"q","key":null,"limit":null}"#;
        assert!(decode(find).is_ok());
        let paused = r#"{"id":1,"op":"queue_update","queue":"q","options":{"paused":true}}"#;
        assert!(
            matches!(decode(paused), Ok(Request::QueueUpdate(u)) if u.options.paused == Some(true))
        );
    }
}
