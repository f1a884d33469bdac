#![no_main]
// Reads arbitrary text as a cloud-api connection file.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vpn_client::fuzz::connection_file(data));
