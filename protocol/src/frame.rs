//! Frames: a 4-byte big-endian length, then that many bytes of one UTF-8 JSON object.
//!
//! Both directions of every stream carry only frames. The length is checked against
//! [`crate::limits::MAX_FRAME_BYTES`] before a single byte of the body is buffered.
//!
//! [`FrameReader`] is the one reader of length-prefixed frames: the protocol's, and with
//! a limit and rules of their own ([`FrameReader::with_limit`]) the daemon's
//! node-to-node RPCs and snapshot files, whose bodies are postcard.

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

/// Reads the body length from a frame header and checks it against the protocol's
/// rules: at most [`MAX_FRAME_BYTES`], not empty.
pub fn body_len(header: [u8; HEADER_LEN]) -> Result<usize, FrameError> {
    checked_len(header, MAX_FRAME_BYTES, false)
}

/// Reads the body length from a frame header and checks it against `limit` (and, unless
/// `empty`, refuses a zero length).
fn checked_len(header: [u8; HEADER_LEN], limit: usize, empty: bool) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len == 0 && !empty {
        return Err(FrameError::Empty);
    }
    if len > limit {
        return Err(FrameError::TooLarge { len, limit });
    }
    Ok(len)
}

/// Bytes of frames already taken after which [`FrameReader`] drops them from its buffer.
const COMPACT_BYTES: usize = 64 * 1024;

/// Buffer room a reader keeps once it is empty; more is given back.
const KEEP_BYTES: usize = 256 * 1024;

/// Splits a byte stream into frame bodies: the one frame reader of the daemon (client
/// streams, node-to-node RPCs, snapshot files), the SDK and the fuzz targets. It does no
/// I/O: feed it the bytes that arrived with [`FrameReader::push`], then take every
/// complete body with [`FrameReader::next_frame`]. [`FrameReader::wants`] says how many
/// bytes the frame in progress still needs, so a caller can read no further than one
/// frame, and [`FrameReader::in_frame`] whether a stream ending now ends cleanly.
///
/// Each header is checked (against the reader's limit, and its rule on empty bodies)
/// before any of its body is kept. Once a header is accepted the buffer takes room for
/// exactly the rest of its frame (at most the limit; counted by
/// [`FrameReader::capacity`]), unless the reader was made
/// [`FrameReader::growing_with_arrivals`]: then it grows only with the bytes pushed.
/// After a refused header the stream's frame boundaries are lost: the reader returns
/// the error again and takes no more.
#[derive(Debug)]
pub struct FrameReader {
    /// Bytes received and not yet returned as frames.
    buf: Vec<u8>,
    /// Where the unread part of `buf` starts.
    start: usize,
    /// Set once a header was refused.
    failed: Option<FrameError>,
    /// The largest body accepted.
    limit: usize,
    /// Whether a zero-length body is a frame (else [`FrameError::Empty`]).
    empty: bool,
    /// Whether the buffer takes room for the rest of a frame once its header is
    /// accepted (else it grows only as bytes are pushed).
    reserve: bool,
}

/// What a [`FrameReader`] needs before [`FrameReader::next_frame`] has more to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wants {
    /// This many more bytes of the next frame's header (1 to [`HEADER_LEN`]).
    Header(usize),
    /// More of the body of a frame whose header was accepted.
    Body {
        /// The body's length, from its header.
        len: usize,
        /// The bytes of it that have not arrived (at least 1).
        missing: usize,
    },
    /// Nothing: [`FrameReader::next_frame`] returns a frame, or the refusal of a header.
    Nothing,
}

impl Default for FrameReader {
    fn default() -> FrameReader {
        FrameReader::with_limit(MAX_FRAME_BYTES)
    }
}

impl FrameReader {
    /// A reader at the start of a stream of protocol frames: bodies of at most
    /// [`MAX_FRAME_BYTES`], none empty.
    pub fn new() -> FrameReader {
        FrameReader::default()
    }

    /// A protocol reader whose buffer starts with room for `bytes` (what a stream is read
    /// with at a time, plus a frame in progress): it then never reallocates for small
    /// frames.
    pub fn with_capacity(bytes: usize) -> FrameReader {
        FrameReader {
            buf: Vec::with_capacity(bytes),
            ..FrameReader::default()
        }
    }

    /// A reader of frames whose bodies hold at most `limit` bytes; otherwise as
    /// [`FrameReader::new`] (an empty body refused, room taken for a frame in progress).
    pub fn with_limit(limit: usize) -> FrameReader {
        FrameReader {
            buf: Vec::new(),
            start: 0,
            failed: None,
            limit,
            empty: false,
            reserve: true,
        }
    }

    /// The same reader, taking a zero-length body as a frame: for formats whose decoder,
    /// not the framing, says what an empty body is.
    pub fn allowing_empty(mut self) -> FrameReader {
        self.empty = true;
        self
    }

    /// The same reader, never taking room ahead for the rest of a frame: its buffer grows
    /// only as bytes are pushed. For large limits, where the caller bounds memory by what
    /// it reads at a time.
    pub fn growing_with_arrivals(mut self) -> FrameReader {
        self.reserve = false;
        self
    }

    /// The largest body this reader accepts.
    pub fn limit(&self) -> usize {
        self.limit
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
        let len = match checked_len(*header, self.limit, self.empty) {
            Ok(len) => len,
            Err(e) => {
                self.buf = Vec::new();
                self.start = 0;
                self.failed = Some(e.clone());
                return Err(e);
            }
        };
        let end = self.start + HEADER_LEN + len;
        if end > self.buf.len() {
            if self.reserve {
                // Room for exactly the rest of this frame, not a doubling of the buffer.
                self.buf.reserve_exact(end - self.buf.len());
            }
            return Ok(None);
        }
        let body = if end == self.buf.len() && self.buf.capacity() > KEEP_BYTES {
            // A large frame ends the buffer, whose room is not kept: it becomes the body
            // (its bytes moved to the front) rather than being copied.
            let mut whole = std::mem::take(&mut self.buf);
            whole.drain(..self.start + HEADER_LEN);
            self.start = 0;
            whole
        } else {
            let body = self.buf[self.start + HEADER_LEN..end].to_vec();
            self.start = end;
            self.after_frame();
            body
        };
        debug_assert_eq!(
            body.len(),
            len,
            "a frame's body is as long as its header says"
        );
        Ok(Some(body))
    }

    /// Drops what the frame just returned leaves behind, so that the buffer stays small.
    fn after_frame(&mut self) {
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
    }

    /// What must arrive before [`FrameReader::next_frame`] has more to say: the rest of
    /// the next frame's header, else the rest of its body (the header checked as
    /// `next_frame` checks it: a refused one wants nothing, `next_frame` says why).
    /// Reading no more than this reads no further than the frame.
    pub fn wants(&self) -> Wants {
        if self.failed.is_some() {
            return Wants::Nothing;
        }
        let rest = &self.buf[self.start..];
        let Some(header) = rest.first_chunk::<HEADER_LEN>() else {
            return Wants::Header(HEADER_LEN - rest.len());
        };
        let Ok(len) = checked_len(*header, self.limit, self.empty) else {
            return Wants::Nothing;
        };
        match (HEADER_LEN + len).checked_sub(rest.len()) {
            Some(missing) if missing > 0 => Wants::Body { len, missing },
            _ => Wants::Nothing,
        }
    }

    /// Bytes the reader holds allocated: what it costs in memory now.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// True if bytes of an unfinished frame (its header or its body) are buffered: a
    /// stream ending now ends in the middle of a frame.
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
    fn a_reader_wants_the_rest_of_its_header_then_of_its_body_and_no_further() {
        let mut stream = Vec::new();
        push_frame(&mut stream, b"abcdef");
        push_frame(&mut stream, b"xy");
        let mut reader = FrameReader::new();
        assert_eq!(reader.wants(), Wants::Header(4));
        assert!(!reader.in_frame());
        reader.push(&stream[..3]);
        assert_eq!(reader.wants(), Wants::Header(1));
        assert!(
            reader.in_frame(),
            "a stream ending inside a header ends inside a frame"
        );
        assert_eq!(reader.next_frame(), Ok(None));
        reader.push(&stream[3..5]);
        assert_eq!(reader.wants(), Wants::Body { len: 6, missing: 5 });
        assert_eq!(reader.next_frame(), Ok(None));
        reader.push(&stream[5..10]);
        assert_eq!(reader.wants(), Wants::Nothing);
        assert_eq!(reader.next_frame(), Ok(Some(b"abcdef".to_vec())));
        assert_eq!(reader.wants(), Wants::Header(4));
        assert!(!reader.in_frame());
        // Bytes past the frame arrived with it: the next frame wants only the rest.
        reader.push(&stream[10..13]);
        assert_eq!(reader.wants(), Wants::Header(1));
        reader.push(&stream[13..]);
        assert_eq!(reader.wants(), Wants::Nothing);
        assert_eq!(reader.next_frame(), Ok(Some(b"xy".to_vec())));
        assert_eq!(reader.wants(), Wants::Header(4));
        // A refused header wants nothing more: the reader says why.
        reader.push(&0u32.to_be_bytes());
        assert_eq!(reader.wants(), Wants::Nothing);
        assert_eq!(reader.next_frame(), Err(FrameError::Empty));
        assert_eq!(reader.wants(), Wants::Nothing);
    }

    #[test]
    fn a_reader_with_a_limit_of_its_own_refuses_by_it_and_may_take_empty_bodies() {
        let mut reader = FrameReader::with_limit(10);
        assert_eq!(reader.limit(), 10);
        assert_eq!(FrameReader::new().limit(), MAX_FRAME_BYTES);
        let mut stream = Vec::new();
        push_frame(&mut stream, &[7; 10]);
        reader.push(&stream);
        assert_eq!(reader.next_frame(), Ok(Some(vec![7; 10])));
        reader.push(&11u32.to_be_bytes());
        assert_eq!(reader.wants(), Wants::Nothing);
        assert_eq!(
            reader.next_frame(),
            Err(FrameError::TooLarge { len: 11, limit: 10 })
        );
        reader.push(&[0; 11]);
        assert_eq!(reader.capacity(), 0, "nothing kept after a refused header");

        // An empty body refused by default; a frame of its own where allowed.
        let mut empty = FrameReader::with_limit(10);
        empty.push(&0u32.to_be_bytes());
        assert_eq!(empty.next_frame(), Err(FrameError::Empty));
        let mut empty = FrameReader::with_limit(10).allowing_empty();
        let mut stream = Vec::new();
        push_frame(&mut stream, b"");
        push_frame(&mut stream, b"z");
        empty.push(&stream);
        assert_eq!(empty.next_frame(), Ok(Some(Vec::new())));
        assert_eq!(empty.next_frame(), Ok(Some(b"z".to_vec())));
        assert_eq!(empty.next_frame(), Ok(None));
        assert!(!empty.in_frame());
    }

    #[test]
    fn a_reader_growing_with_arrivals_takes_no_room_for_what_a_header_announces() {
        const LEN: usize = 1 << 20;
        let mut stream = Vec::new();
        push_frame(&mut stream, &vec![3; LEN]);

        // The protocol's reader takes room for the whole frame once its header is read.
        let mut reserving = FrameReader::with_limit(LEN);
        reserving.push(&stream[..HEADER_LEN]);
        assert_eq!(reserving.next_frame(), Ok(None));
        assert!(reserving.capacity() >= HEADER_LEN + LEN);

        // One growing with arrivals holds what arrived (give or take a Vec's growth).
        let mut growing = FrameReader::with_limit(LEN).growing_with_arrivals();
        growing.push(&stream[..HEADER_LEN]);
        assert_eq!(growing.next_frame(), Ok(None));
        assert!(growing.capacity() < 64, "{}", growing.capacity());
        assert_eq!(
            growing.wants(),
            Wants::Body {
                len: LEN,
                missing: LEN
            }
        );
        growing.push(&stream[HEADER_LEN..HEADER_LEN + 1000]);
        assert_eq!(growing.next_frame(), Ok(None));
        assert!(growing.capacity() < 4 * 1000, "{}", growing.capacity());
        growing.push(&stream[HEADER_LEN + 1000..]);
        // A large frame that ends the buffer is handed over as the body: the reader
        // keeps no room for it and makes no copy.
        let body = growing.next_frame().unwrap().unwrap();
        assert_eq!(body, vec![3; LEN]);
        assert_eq!(growing.capacity(), 0);
        assert!(!growing.in_frame());
        assert_eq!(growing.wants(), Wants::Header(HEADER_LEN));
    }

    #[test]
    fn a_large_frame_is_handed_over_or_copied_and_what_follows_is_kept() {
        let big = vec![9u8; KEEP_BYTES + 1];
        let mut stream = Vec::new();
        push_frame(&mut stream, &big);
        push_frame(&mut stream, b"after");
        for cut in [stream.len() - 9, stream.len()] {
            let mut reader = FrameReader::new();
            reader.push(&stream[..cut]);
            assert_eq!(reader.next_frame(), Ok(Some(big.clone())));
            reader.push(&stream[cut..]);
            assert_eq!(
                reader.next_frame(),
                Ok(Some(b"after".to_vec())),
                "cut at {cut}"
            );
            assert_eq!(reader.next_frame(), Ok(None));
            assert!(!reader.in_frame());
        }
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
