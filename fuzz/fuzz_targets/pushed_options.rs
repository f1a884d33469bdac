#![no_main]
// Feeds arbitrary text as pushed options (NUL between PUSH_REPLY parts) to the client's pull policy and push guard.
libfuzzer_sys::fuzz_target!(|data: &[u8]| protocol::fuzz::pushed_options(data));
