//! The test lab: network namespaces, a throwaway PKI, upstream OpenVPN and tinyproxy
//! processes, and the client side of the CONNECT sidecar tests.
//!
//! Test-only helpers shared by every crate whose tests run real programs in network
//! namespaces. It depends on none of our binaries' crates (`vpn-server`, `vpn-client`,
//! `vpn-router`), so their own integration tests (which run the binaries through
//! `CARGO_BIN_EXE_*`) can dev-depend on it without a cycle. What drives our server and client
//! as libraries, the demo, the matrix and the bench live in `conformance`, which builds on
//! this crate.
//!
//! * [`netns::Netns`] - a private network namespace with `lo` up; runs commands and threads inside
//!   it and, on drop (also while a test panics), kills every process it started and deletes itself.
//! * [`pki_fixture::TestPki`] - a throwaway ECDSA P-256 CA, server and client certificate and a
//!   `ta.key`, made with the `openssl` and `openvpn` CLIs in a temporary directory.
//! * [`upstream::UpstreamOpenvpn`] - a real `openvpn` process inside a [`netns::Netns`],
//!   with its log, killed on drop; configs for an upstream server and client. The program is
//!   [`referee::referee`]: `$OPENVPN_REFEREE` (e.g. a 2.7 build), else Debian's `openvpn`.
//! * [`tinyproxy`] - Debian's tinyproxy as the CONNECT proxy of a lab, started and awaited.
//! * [`icmp`] - IPv4 echo requests to push through a tunnel, and the check of the reply.
//! * [`sidecar_client`] - certificates made with the `pki` crate, a runtime inside a namespace,
//!   an mTLS CONNECT client, a connection recorder and a metrics scrape for the CONNECT sidecar
//!   tests (the sidecar itself is started by the test: as a binary or through `conformance`).
//! * [`image::Image`] - the images `images/build` makes: their configuration and a fresh copy
//!   of their root filesystem per container.
//! * [`container::Pod`] - containers started as Kubernetes starts them, from an image's root
//!   filesystem inside a lab namespace: volumes, user, capabilities, exec probes, logs.
//! * [`tls_hello`] - a ClientHello record naming a server, for SNI routers and balancers.
//! * [`require_lab`] - fails a test loudly when it cannot run (not root, tool missing): a lab
//!   test never passes by skipping.
//!
//! Network rule: everything here happens inside namespaces the lab created. Nothing adds an
//! address, a route or a firewall rule in the root namespace; veth pairs only join two lab
//! namespaces, and every namespace is deleted when its guard drops.

pub mod container;
pub mod icmp;
pub mod image;
pub mod netns;
pub mod pki_fixture;
pub mod referee;
pub mod sidecar_client;
pub mod tinyproxy;
pub mod tls_hello;
pub mod transfer;
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
            "lab unavailable: {msg} (these tests need root, /dev/net/tun, \
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
        // Upstream OpenVPN is the referee the environment names.
        let program = match *tool {
            "openvpn" => upstream::referee(),
            other => other.to_owned(),
        };
        Command::new(&program)
            .arg(arg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|source| LabError::MissingTool {
                tool: program.clone(),
                source,
            })?;
    }
    Ok(())
}
