#![no_main]
// Reads arbitrary text as an Envoy bootstrap file, as `envoy -c` does.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sidecar::fuzz::envoy_yaml(data));
