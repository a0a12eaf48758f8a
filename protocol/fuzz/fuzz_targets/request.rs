//! Fuzz target: one frame body decoded as a request.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    muster_protocol::fuzzing::request(data);
});
