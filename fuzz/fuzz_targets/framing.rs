#![no_main]
// Feeds arbitrary bytes to the TCP frame decoder until it reports an error or needs more.
libfuzzer_sys::fuzz_target!(|data: &[u8]| protocol::fuzz::framing(data));
