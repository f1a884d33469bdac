#![no_main]
// Reads arbitrary bytes as a status file, and writes and reads back a status built from them.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vpn_server::fuzz::status_file(data));
