#![no_main]
// Reads arbitrary bytes as a vpn-router --config-dir directory (NUL-separated files), loaded in three orders.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vpn_router::fuzz::config_dir(data));
