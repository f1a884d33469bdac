#![no_main]
// Feeds arbitrary bytes to the strict CONNECT request parser and the routing-value parser.
libfuzzer_sys::fuzz_target!(|data: &[u8]| protocol::fuzz::http_request(data));
