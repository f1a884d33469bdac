#![no_main]
// Parses arbitrary bytes as key-method-2 messages; whatever parses must re-emit identically.
libfuzzer_sys::fuzz_target!(|data: &[u8]| protocol::fuzz::key_method_2(data));
