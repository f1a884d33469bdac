//! End-to-end tests in network namespaces, interop against upstream OpenVPN 2.6, benchmarks
//! against upstream and the demo.
//!
//! The library part is the *lab*: small, test-only helpers that every conformance test uses.
//!
//! * [`netns::Netns`] - a private network namespace with `lo` up; runs commands and threads inside
//!   it and, on drop (also while a test panics), kills every process it started and deletes itself.
//! * [`pki_fixture::TestPki`] - a throwaway ECDSA P-256 CA, server and client certificate and a
//!   `ta.key`, made with the `openssl` and `openvpn` CLIs in a temporary directory.
//! * [`upstream::UpstreamOpenvpn`] - a real `openvpn` 2.6 process inside a [`netns::Netns`],
//!   with its log, killed on drop.
//! * [`probe`] - the first exchange of a session (hard resets and an ACK) done with our
//!   `protocol` crate against a real peer.
//! * [`demo`] - the demo: seed, ingress proxy, shoot and pod namespaces, our server and client,
//!   ping and a download through the tunnel, a summary.
//! * [`matrix`] - the conformance matrix: our server and client against upstream OpenVPN 2.6
//!   and each other over ciphers, control-channel wrapping, key derivation, transports and
//!   life-cycle scenarios (`tests/matrix.rs` runs it).
//! * [`connect_acceptor`] - a minimal CONNECT proxy (strict head, an optional required header,
//!   a fixed or requested upstream) standing in for a gateway or corporate proxy.
//! * [`driver`] - a blocking driver for our sans-IO sessions over a real TCP connection.
//! * [`icmp`] - IPv4 echo requests to push through a tunnel, and the check of the reply.
//! * [`sidecar_lab`] - certificates, a namespaced runtime, an mTLS CONNECT client, a
//!   connection recorder and a metrics scrape for the CONNECT sidecar tests.
//! * [`tinyproxy`] - Debian's tinyproxy as the CONNECT proxy of a lab, started and awaited.
//! * [`require_lab`] - fails a test loudly when it cannot run (not root, tool missing): a lab
//!   test never passes by skipping.
//!
//! Network rule: everything here happens inside namespaces the lab created. Nothing adds an
//! address or a route in the root namespace; veth pairs only join two lab namespaces.

pub mod bench;
pub mod connect_acceptor;
pub mod demo;
pub mod driver;
pub mod icmp;
pub mod matrix;
pub mod netns;
pub mod our_client;
pub mod our_server;
pub mod pki_fixture;
pub mod probe;
pub mod sidecar_lab;
pub mod tinyproxy;
pub mod upstream;

mod error;

pub use error::LabError;

use std::path::Path;
use std::process::{Command, Stdio};

/// Panics with a clear message unless this process can run lab tests: effective uid 0,
/// `/dev/net/tun` present, and every program in `tools` (plus `ip`) runnable.
///
/// Call it first in every test that needs namespaces or upstream tools, so a machine without
/// them fails the test instead of silently passing it.
pub fn require_lab(tools: &[&str]) {
    if let Err(err) = check_lab(tools) {
        let mut msg = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            msg.push_str(": ");
            msg.push_str(&cause.to_string());
            source = cause.source();
        }
        panic!(
            "conformance lab unavailable: {msg} (these tests need root, /dev/net/tun, \
             iproute2, openvpn and openssl; they fail rather than skip)"
        );
    }
}

/// Non-panicking form of [`require_lab`].
pub fn check_lab(tools: &[&str]) -> Result<(), LabError> {
    if !rustix::process::geteuid().is_root() {
        return Err(LabError::NotRoot);
    }
    if !Path::new("/dev/net/tun").exists() {
        return Err(LabError::MissingTun);
    }
    for tool in std::iter::once(&"ip").chain(tools) {
        let arg = match *tool {
            "ip" => "-V",
            "openssl" => "version",
            _ => "--version",
        };
        Command::new(tool)
            .arg(arg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|source| LabError::MissingTool {
                tool: (*tool).to_owned(),
                source,
            })?;
    }
    Ok(())
}
