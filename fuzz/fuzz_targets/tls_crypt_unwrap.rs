#![no_main]
// Unwraps arbitrary bytes with tls-crypt (fixed key).
libfuzzer_sys::fuzz_target!(|data: &[u8]| protocol::fuzz::tls_crypt_unwrap(data));
