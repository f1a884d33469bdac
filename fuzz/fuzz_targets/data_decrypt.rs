#![no_main]
// Decrypts arbitrary bytes as a data packet with every cipher (fixed keys).
libfuzzer_sys::fuzz_target!(|data: &[u8]| protocol::fuzz::data_decrypt(data));
