//! Code shared by the conformance test binaries.

#![allow(dead_code)] // each test binary uses a different part

pub mod local_tls_auth;
