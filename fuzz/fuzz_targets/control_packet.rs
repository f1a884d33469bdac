#![no_main]
// Parses arbitrary bytes as a control packet; whatever parses must re-emit identically.
libfuzzer_sys::fuzz_target!(|data: &[u8]| protocol::fuzz::control_packet(data));
