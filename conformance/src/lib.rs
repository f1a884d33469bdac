//! End-to-end tests in network namespaces, interop against upstream OpenVPN 2.6, and the demo.
//! The benchmark against upstream is the `bench` crate, which builds on this one.
//!
//! The library part builds on the `lab` crate (namespaces, the throwaway PKI, upstream OpenVPN,
//! tinyproxy, the sidecar tests' client side), which knows nothing of our programs, and adds
//! what runs them.
//!
//! From `lab`, re-exported here so tests read `conformance::netns::Netns` etc.:
//!
//! * [`netns::Netns`] - a private network namespace with `lo` up; runs commands and threads inside
//!   it and, on drop (also while a test panics), kills every process it started and deletes itself.
//! * [`pki_fixture::TestPki`] - a throwaway ECDSA P-256 CA, server and client certificate and a
//!   `ta.key`, made with the `openssl` and `openvpn` CLIs in a temporary directory.
//! * [`upstream::UpstreamOpenvpn`] - a real `openvpn` process (Debian's 2.6, or what
//!   `OPENVPN_REFEREE` names: [`upstream::referee`]) inside a [`netns::Netns`],
//!   with its log, killed on drop.
//! * [`tinyproxy`] - Debian's tinyproxy as the CONNECT proxy of a lab, started and awaited.
//! * [`icmp`] - IPv4 echo requests to push through a tunnel, and the check of the reply.
//! * [`require_lab`] / [`check_lab`] - fail a test loudly when it cannot run (not root, tool
//!   missing): a lab test never passes by skipping. [`LabError`] - why a lab step failed.
//!
//! Our own:
//!
//! * [`our_server`] / [`our_client`] - our server and client as libraries on a thread inside a
//!   lab namespace; [`our_settings::OurSettings`] - their settings for a [`pki_fixture::TestPki`].
//! * [`probe`] - the first exchange of a session (hard resets and an ACK) done with our
//!   `protocol` crate against a real peer.
//! * [`driver`] - a blocking driver for our sans-IO sessions over a real TCP connection.
//! * [`sidecar_lab`] - our CONNECT sidecar started in process inside a lab namespace, with
//!   `lab::sidecar_client` (certificates, a namespaced runtime, an mTLS CONNECT client, a
//!   connection recorder and a metrics scrape) re-exported.
//! * [`tunnel_lab`] - the seed–shoot–pod namespaces with our server and client's settings
//!   for the in-process tunnel tests (`sidecar_tunnel`, `hold_reconnect`).
//! * [`connect_acceptor`] - a minimal CONNECT proxy (strict head, an optional required header,
//!   a fixed or requested upstream) standing in for a gateway or corporate proxy.
//! * [`demo`] - the demo: seed, ingress proxy, shoot and pod namespaces, our server and client,
//!   ping and a download through the tunnel, a summary.
//! * [`gardener`] - Gardener's non-HA VPN pods replayed in namespaces: the landscape, a
//!   kubelet's probes, our binaries started as Gardener starts vpn2's images, upstream
//!   OpenVPN configured as vpn2 configures it, and the checks a replay must pass; the
//!   in-place switch's surge pods, Service and load (`tests/switch_nonha.rs`).
//! * [`matrix`] - the conformance matrix: our server and client against upstream OpenVPN 2.6
//!   and each other over ciphers, control-channel wrapping, key derivation, transports and
//!   life-cycle scenarios (`tests/matrix.rs` runs it).
//! * [`flood`] - a flood of silent and bogus connections against a server or its proxy, held
//!   in a lab namespace (the `preauth_*` tests and the bench's flood part).
//! * [`kube_api`] - a stand-in for the Kubernetes API server (list, watch with bookmarks,
//!   `410 Gone`, cut connections, slow answers, over HTTPS) for `vpn-router --kubernetes`:
//!   no API server can run on the test machines; [`kube_objects`] - the objects Gardener and
//!   the ACL extension create for a shoot, as the stand-in serves them.
//! * [`wait`] - polling a lab until a check holds, with a limit and a panic naming what never
//!   happened.
//!
//! Network rule: everything here happens inside namespaces the lab created. Nothing adds an
//! address or a route in the root namespace; veth pairs only join two lab namespaces.

pub mod connect_acceptor;
pub mod demo;
pub mod driver;
pub mod echo;
pub mod flood;
pub mod gardener;
pub mod kube_api;
pub mod kube_objects;
pub mod matrix;
pub mod our_client;
pub mod our_server;
pub mod our_settings;
pub mod probe;
pub mod sidecar_lab;
pub mod tunnel_lab;
pub mod wait;

pub use lab::{
    check_lab, icmp, netns, pki_fixture, require_lab, tinyproxy, tls_hello, transfer, upstream,
    LabError,
};
