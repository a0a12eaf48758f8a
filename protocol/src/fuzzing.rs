//! Entry points of the fuzz targets (`protocol/fuzz`), shared with the test that
//! replays their seed corpus on stable Rust, so both exercise exactly the same code.
//!
//! Neither may panic on any input: they are the daemon's first contact with bytes
//! from the network.

use crate::frame::FrameReader;
use crate::ops::decode_request;

/// Reads `data` as the daemon reads a stream, with the daemon's [`FrameReader`], the
/// bytes arriving in pieces whose sizes the first byte picks; decodes every frame,
/// until the bytes run out or a header is refused. Returns how many frames decoded
/// into requests.
pub fn frames(data: &[u8]) -> usize {
    let piece = usize::from(data.first().copied().unwrap_or(0)).max(1);
    let mut reader = FrameReader::new();
    let mut decoded = 0;
    for chunk in data.chunks(piece) {
        reader.push(chunk);
        loop {
            match reader.next_frame() {
                Ok(Some(body)) => decoded += usize::from(decode_request(&body).is_ok()),
                Ok(None) => break,
                Err(_) => return decoded,
            }
        }
    }
    decoded
}

/// Decodes one frame body as a request: whatever the bytes, it decodes to a named op or
/// is refused with a message saying why, and it never panics.
pub fn request(data: &[u8]) -> bool {
    match decode_request(data) {
        Ok((_, req)) => {
            assert!(!req.name().is_empty());
            true
        }
        Err(e) => {
            assert!(!e.error.message.is_empty());
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn corpus(target: &str) -> Vec<Vec<u8>> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus")
            .join(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
            .into_iter()
            .map(|p| std::fs::read(p).unwrap())
            .collect()
    }

    #[test]
    fn the_request_corpus_replays_without_a_panic() {
        let inputs = corpus("request");
        assert!(inputs.len() >= 20, "{} seeds", inputs.len());
        let decoded = inputs.iter().filter(|i| super::request(i)).count();
        // The seeds hold valid requests of every op and broken ones.
        assert!(
            decoded >= 10 && decoded < inputs.len(),
            "{decoded} of {}",
            inputs.len()
        );
    }

    #[test]
    fn the_frame_corpus_replays_without_a_panic() {
        let inputs = corpus("frame");
        assert!(inputs.len() >= 5, "{} seeds", inputs.len());
        let decoded: usize = inputs.iter().map(|i| super::frames(i)).sum();
        assert!(decoded >= 3, "{decoded} frames decoded");
    }
}
