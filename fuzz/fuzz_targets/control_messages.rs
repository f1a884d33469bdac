#![no_main]
// Splits arbitrary TLS plaintext into control messages and filters every PUSH_REPLY.
libfuzzer_sys::fuzz_target!(|data: &[u8]| protocol::fuzz::control_messages(data));
