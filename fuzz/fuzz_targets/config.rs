#![no_main]
// Feeds arbitrary text to the config-file, client-config-dir and vpn2-environment parsers.
libfuzzer_sys::fuzz_target!(|data: &[u8]| protocol::fuzz::config(data));
