#![no_main]
// Feeds arbitrary bytes to the PROXY protocol v1/v2 header parser; accepted headers must round-trip.
libfuzzer_sys::fuzz_target!(|data: &[u8]| protocol::fuzz::proxy_protocol(data));
