#![no_main]
// Feeds arbitrary bytes to the SNI listener's ClientHello parser: it decides or asks for more,
// never panics, and a hello it returns lies within the bytes given.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(Some(hello)) = vpn_router::client_hello::parse(data) {
        assert!(hello.len <= data.len());
    }
});
