#![no_main]
// Unwraps arbitrary bytes with tls-auth (each digest, fixed key).
libfuzzer_sys::fuzz_target!(|data: &[u8]| protocol::fuzz::tls_auth_unwrap(data));
