//! End-to-end tests in network namespaces, interop against upstream OpenVPN 2.6, benchmarks
//! against upstream and the demo.
