//! Frames: a 4-byte big-endian length, then that many bytes of one UTF-8 JSON object.
//!
//! Both directions of every stream carry only frames. The length is checked against
//! [`crate::limits::MAX_FRAME_BYTES`] before a single byte of the body is buffered.

use crate::limits::MAX_FRAME_BYTES;

/// Length of the frame header.
pub const HEADER_LEN: usize = 4;

/// Why a frame could not be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The announced length is above the frame limit.
    #[error("frame of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The length from the header.
        len: usize,
        /// The limit it broke.
        limit: usize,
    },
    /// A zero-length frame carries no JSON object.
    #[error("empty frame")]
    Empty,
}

/// Reads the body length from a frame header and checks it against the limit.
pub fn body_len(header: [u8; HEADER_LEN]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len == 0 {
        return Err(FrameError::Empty);
    }
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            len,
            limit: MAX_FRAME_BYTES,
        });
    }
    Ok(len)
}

/// Bytes of frames already taken after which [`FrameReader`] drops them from its buffer.
const COMPACT_BYTES: usize = 64 * 1024;

/// Buffer room a reader keeps once it is empty; more is given back.
const KEEP_BYTES: usize = 256 * 1024;

/// Splits a byte stream into frame bodies: the one frame reader of the daemon, the SDK
/// and the fuzz targets. It does no I/O: feed it the bytes that arrived with
/// [`FrameReader::push`], then take every complete body with [`FrameReader::next_frame`].
///
/// Each header is checked ([`body_len`]) before any of its body is kept, and the
/// buffer only ever holds bytes that arrived: a peer cannot make it reserve a frame's
/// announced length by sending a header alone. After a refused header the stream's
/// frame boundaries are lost: the reader returns the error again and takes no more.
#[derive(Debug, Default)]
pub struct FrameReader {
    /// Bytes received and not yet returned as frames.
    buf: Vec<u8>,
    /// Where the unread part of `buf` starts.
    start: usize,
    /// Set once a header was refused.
    failed: Option<FrameError>,
}

impl FrameReader {
    /// A reader at the start of a stream.
    pub fn new() -> FrameReader {
        FrameReader::default()
    }

    /// A reader whose buffer starts with room for `bytes` (what a stream is read with at
    /// a time, plus a frame in progress): it then never reallocates for small frames.
    pub fn with_capacity(bytes: usize) -> FrameReader {
        FrameReader {
            buf: Vec::with_capacity(bytes),
            ..FrameReader::default()
        }
    }

    /// Appends bytes that arrived on the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        if self.start > 0 {
            // Drop what was read before taking more: the buffer stays one chunk plus
            // the frame in progress.
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame body; `Ok(None)` until more bytes arrive.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let rest = &self.buf[self.start..];
        let Some(header) = rest.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let len = match body_len(*header) {
            Ok(len) => len,
            Err(e) => {
                self.buf = Vec::new();
                self.start = 0;
                self.failed = Some(e.clone());
                return Err(e);
            }
        };
        let Some(body) = rest.get(HEADER_LEN..HEADER_LEN + len) else {
            // Room for exactly the rest of this frame, not a doubling of the buffer.
            let missing = HEADER_LEN + len - rest.len();
            self.buf.reserve_exact(missing);
            return Ok(None);
        };
        let body = body.to_vec();
        self.start += HEADER_LEN + len;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            if self.buf.capacity() > KEEP_BYTES {
                // A large frame went through: do not keep its room.
                self.buf = Vec::new();
            }
        } else if self.start >= COMPACT_BYTES {
            // A long run of small frames must not grow the buffer: drop what was read.
            self.buf.drain(..self.start);
            self.start = 0;
        }
        Ok(Some(body))
    }

    /// Bytes the reader holds allocated: what it costs in memory now.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// True if bytes of an unfinished frame are buffered: a stream ending now ends
    /// in the middle of a frame.
    pub fn in_frame(&self) -> bool {
        self.start < self.buf.len()
    }
}

/// The deepest nesting of arrays and objects in JSON text, counting only brackets
/// outside strings. It does not validate the JSON (the parser does that); it only
/// measures, in one pass and without recursion, so depth can be refused up front.
pub fn json_depth(text: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut at = 0;
    while let Some(&b) = text.get(at) {
        match b {
            b'"' => {
                // A string's bytes are skipped in one search for its closing quote or an
                // escape (most of a payload is strings), not looked at one by one.
                at += 1;
                loop {
                    let Some(found) = text
                        .get(at..)
                        .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
                    else {
                        // An unterminated string: the parser refuses it.
                        return deepest;
                    };
                    at += found;
                    if text[at] == b'"' {
                        break;
                    }
                    // An escape: the byte after the backslash is the string's, whatever it is.
                    at += 2;
                }
            }
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        at += 1;
    }
    deepest
}

/// Appends one frame holding `body` to `out`.
///
/// The caller guarantees `body` fits the limit; [`encode_json`] checks it for serialized values.
pub fn push_frame(out: &mut Vec<u8>, body: &[u8]) {
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(body);
}

/// Serializes `value` as JSON and frames it.
pub fn encode_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, FrameError> {
    let mut out = Vec::new();
    append_json(&mut out, value)?;
    Ok(out)
}

/// Serializes `value` as JSON and appends it to `out` as one frame, written in place
/// (no buffer of its own). A value over [`MAX_FRAME_BYTES`] leaves `out` as it was.
pub fn append_json<T: serde::Serialize + ?Sized>(
    out: &mut Vec<u8>,
    value: &T,
) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER_LEN]);
    // Serializing our own types into a Vec cannot fail: they hold no maps with non-string keys.
    let written = serde_json::to_writer(&mut *out, value);
    let len = out.len() - start - HEADER_LEN;
    if written.is_err() || len > MAX_FRAME_BYTES {
        out.truncate(start);
        return Err(if written.is_err() {
            FrameError::Empty
        } else {
            FrameError::TooLarge {
                len,
                limit: MAX_FRAME_BYTES,
            }
        });
    }
    let header = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    out[start..start + HEADER_LEN].copy_from_slice(&header);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reader_splits_frames_however_the_bytes_arrive() {
        let mut stream = Vec::new();
        for body in [&b"{\"a\":1}"[..], b"{}", b"[1,2,3]"] {
            push_frame(&mut stream, body);
        }
        for chunk in [1, 2, 3, 5, 7, stream.len()] {
            let mut reader = FrameReader::new();
            let mut bodies = Vec::new();
            for piece in stream.chunks(chunk) {
                reader.push(piece);
                while let Some(body) = reader.next_frame().unwrap() {
                    bodies.push(body);
                }
            }
            assert_eq!(
                bodies,
                [b"{\"a\":1}".to_vec(), b"{}".to_vec(), b"[1,2,3]".to_vec()],
                "chunks of {chunk}"
            );
            assert!(!reader.in_frame());
        }
        let mut half = FrameReader::new();
        half.push(&stream[..6]);
        assert_eq!(half.next_frame(), Ok(None));
        assert!(half.in_frame());
    }

    #[test]
    fn the_reader_refuses_a_bad_header_for_good_without_buffering_its_body() {
        let mut reader = FrameReader::new();
        reader.push(&(MAX_FRAME_BYTES as u32 + 1).to_be_bytes());
        let err = reader.next_frame().unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { .. }));
        reader.push(&[0u8; 1024]);
        assert_eq!(reader.next_frame(), Err(err));
        assert!(!reader.in_frame());
        let mut empty = FrameReader::new();
        empty.push(&0u32.to_be_bytes());
        assert_eq!(empty.next_frame(), Err(FrameError::Empty));
    }

    #[test]
    fn frames_are_appended_in_place_and_one_too_large_leaves_the_buffer_as_it_was() {
        let mut out = Vec::new();
        append_json(&mut out, &serde_json::json!({"a": 1})).unwrap();
        let kept = out.clone();
        let huge = "x".repeat(MAX_FRAME_BYTES);
        assert_eq!(
            append_json(&mut out, &huge),
            Err(FrameError::TooLarge {
                len: MAX_FRAME_BYTES + 2,
                limit: MAX_FRAME_BYTES
            })
        );
        assert_eq!(out, kept);
        append_json(&mut out, &[1, 2]).unwrap();
        let mut reader = FrameReader::new();
        reader.push(&out);
        assert_eq!(reader.next_frame().unwrap().unwrap(), br#"{"a":1}"#);
        assert_eq!(reader.next_frame().unwrap().unwrap(), b"[1,2]");
        assert_eq!(reader.next_frame(), Ok(None));
    }

    #[test]
    fn depth_counts_brackets_outside_strings() {
        assert_eq!(json_depth(br#"{"a":1}"#), 1);
        assert_eq!(json_depth(br#"{"a":[[{"b":[]}]]}"#), 5);
        assert_eq!(json_depth(br#"{"a":"[[[[{{{{"}"#), 1);
        assert_eq!(json_depth(br#"{"a":"\"[[["}"#), 1);
        assert_eq!(json_depth(b"1"), 0);
        assert_eq!(json_depth(&b"[".repeat(1000)), 1000);
        // Escaped backslashes end where the string does; brackets after it count again.
        assert_eq!(json_depth(br#"{"a":"x\\","b":[[1]]}"#), 3);
        assert_eq!(json_depth(br#"["\\\"[[", [[]]]"#), 3);
        // Unterminated strings, and an escape as the last byte: what was seen so far.
        assert_eq!(json_depth(br#"[{"a":"[[["#), 2);
        assert_eq!(json_depth(br#"[{"a":"\"#), 2);
        assert_eq!(json_depth(br#"[""#), 1);
    }

    #[test]
    fn header_round_trip_and_limits() {
        assert_eq!(body_len(5u32.to_be_bytes()), Ok(5));
        assert_eq!(body_len(0u32.to_be_bytes()), Err(FrameError::Empty));
        let over = (MAX_FRAME_BYTES as u32 + 1).to_be_bytes();
        assert_eq!(
            body_len(over),
            Err(FrameError::TooLarge {
                len: MAX_FRAME_BYTES + 1,
                limit: MAX_FRAME_BYTES
            })
        );
        let framed = encode_json(&serde_json::json!({"a": 1})).unwrap();
        assert_eq!(&framed[..4], &7u32.to_be_bytes());
        assert_eq!(&framed[4..], br#"{"a":1}"#);
    }
}
