//! Fuzz target: a stream of bytes read as the daemon reads a stream of frames.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    muster_protocol::fuzzing::frames(data);
});
