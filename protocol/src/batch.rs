//! Gathering frames into stream writes: the one piece of write coalescing of the
//! daemon (replies and pushes) and the SDK (requests).
//!
//! It does no I/O. A writer waits for its first frame, then [`WriteBatch::gather`]s
//! every frame already queued behind it, up to [`WRITE_CHUNK`] bytes, writes the batch
//! as one, and tells the batch it was [`WriteBatch::written`]. Many small frames then
//! cost one stream write, and a lone frame is not held back waiting for company.

use std::ops::ControlFlow;

/// Bytes of frames gathered into one stream write. A batch stops taking frames once it
/// holds this many; the frame that crossed it is kept whole.
pub const WRITE_CHUNK: usize = 256 * 1024;

/// The buffer of one stream's writes.
#[derive(Debug)]
pub struct WriteBatch {
    buf: Vec<u8>,
    /// Room kept between writes; more is given back once a batch is written.
    keep: usize,
}

impl WriteBatch {
    /// A batch that keeps up to `keep` bytes of room between writes: little for a
    /// writer of which there are many and most idle (the daemon's streams), a whole
    /// [`WRITE_CHUNK`] for one that writes all the time (a client's one stream).
    pub fn keeping(keep: usize) -> WriteBatch {
        WriteBatch {
            buf: Vec::new(),
            keep,
        }
    }

    /// Gathers one write: `first`, then each item `next` has ready at once, until the
    /// batch holds [`WRITE_CHUNK`] bytes, `next` has none, or `append` (which encodes
    /// an item onto the batch) breaks. Returns the bytes to write and the value
    /// `append` broke with.
    pub fn gather<T, B>(
        &mut self,
        first: T,
        mut next: impl FnMut() -> Option<T>,
        mut append: impl FnMut(&mut Vec<u8>, T) -> ControlFlow<B>,
    ) -> (&[u8], Option<B>) {
        assert!(
            self.buf.is_empty(),
            "the last batch was written before this one"
        );
        let mut stop = append(&mut self.buf, first).break_value();
        while stop.is_none() && self.buf.len() < WRITE_CHUNK {
            let Some(item) = next() else {
                break;
            };
            stop = append(&mut self.buf, item).break_value();
        }
        (&self.buf, stop)
    }

    /// The gathered batch was written (or given up): empties it, giving back room
    /// beyond what it keeps.
    pub fn written(&mut self) {
        self.buf.clear();
        if self.buf.capacity() > self.keep {
            self.buf = Vec::new();
        }
    }

    /// Bytes the batch holds allocated.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(sizes: &[usize]) -> std::vec::IntoIter<Vec<u8>> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| vec![i as u8; n])
            .collect::<Vec<_>>()
            .into_iter()
    }

    fn append(buf: &mut Vec<u8>, frame: Vec<u8>) -> ControlFlow<()> {
        buf.extend_from_slice(&frame);
        ControlFlow::Continue(())
    }

    #[test]
    fn a_batch_takes_what_is_queued_up_to_the_chunk_and_leaves_the_rest() {
        let mut batch = WriteBatch::keeping(16 * 1024);
        let mut queued = frames(&[10, WRITE_CHUNK - 20, 30, 40]);
        let first = queued.next().unwrap();
        let (bytes, stop) = batch.gather(first, || queued.next(), append);
        // The frame that crossed the chunk is kept whole; the next waits.
        assert_eq!((bytes.len(), stop), (WRITE_CHUNK + 20, None));
        assert_eq!((bytes[0], bytes[10], bytes[WRITE_CHUNK - 10]), (0, 1, 2));
        batch.written();
        assert_eq!(batch.capacity(), 0, "a large batch's room is given back");
        let first = queued.next().unwrap();
        let (bytes, stop) = batch.gather(first, || queued.next(), append);
        assert_eq!((bytes.to_vec(), stop), (vec![3; 40], None));
        batch.written();
        assert!(batch.capacity() >= 40, "a small batch's room is kept");
    }

    #[test]
    fn a_batch_ends_where_append_breaks() {
        let mut batch = WriteBatch::keeping(WRITE_CHUNK);
        let mut queued = frames(&[1, 2, 3, 4]);
        let first = queued.next().unwrap();
        let (bytes, stop) = batch.gather(
            first,
            || queued.next(),
            |buf, frame| {
                let last = frame.len() == 2;
                buf.extend_from_slice(&frame);
                if last {
                    ControlFlow::Break("closing")
                } else {
                    ControlFlow::Continue(())
                }
            },
        );
        assert_eq!((bytes, stop), (&[0, 1, 1][..], Some("closing")));
        assert_eq!(queued.len(), 2, "nothing after the break is taken");
    }

    #[test]
    #[should_panic(expected = "the last batch was written before this one")]
    fn gathering_over_an_unwritten_batch_fails_loudly() {
        let mut batch = WriteBatch::keeping(0);
        let _ = batch.gather(vec![1u8], || None, append);
        let _ = batch.gather(vec![2u8], || None, append);
    }
}
