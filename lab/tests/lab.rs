//! The lab itself: namespaces clean up (also on panic), threads really enter them, veth pairs
//! join two lab namespaces, the PKI fixture has the extensions upstream checks, and two
//! upstream peers built from the lab's configs complete a session.

use std::path::Path;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use lab::netns::Netns;
use lab::pki_fixture::TestPki;
use lab::require_lab;
use lab::upstream::{
    tcp_client_config, tcp_server_config, ControlWrap, UpstreamOpenvpn, INITIALIZED_MARKER,
};

fn netns_inode_of_this_thread() -> String {
    std::fs::read_link("/proc/thread-self/ns/net")
        .expect("readlink netns")
        .to_string_lossy()
        .into_owned()
}

fn exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn run_in_enters_the_namespace() {
    require_lab(&[]);
    let ns = Netns::new().expect("netns");
    let outside = netns_inode_of_this_thread();
    let inside = ns.run_in(netns_inode_of_this_thread).expect("run_in");
    assert_ne!(inside, outside);
    let expected = ns
        .run(["readlink", "/proc/self/ns/net"])
        .expect("readlink inside");
    assert_eq!(inside, String::from_utf8_lossy(&expected.stdout).trim());
    // The calling thread is unaffected.
    assert_eq!(netns_inode_of_this_thread(), outside);
}

#[test]
fn drop_kills_processes_and_deletes_namespace() {
    require_lab(&[]);
    let ns = Netns::new().expect("netns");
    let name = ns.name().to_owned();
    let pid = ns
        .spawn(ns.command("sleep").arg("60").stdout(Stdio::null()))
        .expect("spawn");
    assert!(exists(&name) && alive(pid));
    drop(ns);
    assert!(!exists(&name), "namespace {name} still exists");
    assert!(!alive(pid), "process {pid} still alive");
}

#[test]
fn panic_inside_test_still_cleans_up() {
    require_lab(&[]);
    let seen = Mutex::new(None);
    let result = std::panic::catch_unwind(|| {
        let ns = Netns::new().expect("netns");
        let pid = ns
            .spawn(ns.command("sleep").arg("60").stdout(Stdio::null()))
            .expect("spawn");
        *seen.lock().expect("lock") = Some((ns.name().to_owned(), pid));
        ns.run_in(|| panic!("deliberate panic inside the namespace"))
            .expect("run_in");
    });
    assert!(result.is_err(), "the panic must propagate out of run_in");
    let (name, pid) = seen.lock().expect("lock").clone().expect("ran");
    assert!(!exists(&name), "namespace {name} survived the panic");
    assert!(!alive(pid), "process {pid} survived the panic");
}

#[test]
fn veth_pair_joins_two_lab_namespaces() {
    require_lab(&[]);
    let a = Netns::new().expect("netns a");
    let b = Netns::new().expect("netns b");
    Netns::veth_pair(&a, "vpnt-a0", &b, "vpnt-b0").expect("veth");
    let show_a = a.run(["ip", "-o", "link", "show", "vpnt-a0"]).expect("a");
    let show_b = b.run(["ip", "-o", "link", "show", "vpnt-b0"]).expect("b");
    assert!(String::from_utf8_lossy(&show_a.stdout).contains("vpnt-a0@"));
    assert!(String::from_utf8_lossy(&show_b.stdout).contains("vpnt-b0@"));
    // Neither end is in the root namespace.
    assert!(!Path::new("/sys/class/net/vpnt-a0").exists());
    assert!(!Path::new("/sys/class/net/vpnt-b0").exists());
}

#[test]
fn pki_fixture_has_the_extensions_openvpn_checks() {
    require_lab(&["openvpn", "openssl"]);
    let pki = TestPki::generate().expect("pki");
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(pki.dir())
            .output()
            .expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for cert in ["server.crt", "client.crt"] {
        assert!(openssl(&["verify", "-CAfile", "ca.crt", cert]).contains(": OK"));
    }
    let server = openssl(&["x509", "-in", "server.crt", "-noout", "-text"]);
    assert!(
        server.contains("Digital Signature, Key Encipherment"),
        "{server}"
    );
    assert!(server.contains("TLS Web Server Authentication"), "{server}");
    assert!(server.contains("ASN1 OID: prime256v1"), "{server}");
    let client = openssl(&["x509", "-in", "client.crt", "-noout", "-text"]);
    assert!(client.contains("Digital Signature\n"), "{client}");
    assert!(client.contains("TLS Web Client Authentication"), "{client}");
    let ta = pki.ta_key_text().expect("ta.key");
    assert!(ta.contains("-----BEGIN OpenVPN Static key V1-----"));
}

#[test]
fn upstream_client_and_server_from_lab_configs_connect() {
    require_lab(&["openvpn", "openssl"]);
    let ns = Netns::new().expect("netns");
    let pki = TestPki::generate().expect("pki");
    let port = 11941;
    let server = UpstreamOpenvpn::start(
        &ns,
        &tcp_server_config(&pki, port, ControlWrap::TlsAuth, &[]),
        3,
    )
    .expect("server");
    server
        .wait_listening(Duration::from_secs(10))
        .expect("server listening");
    let client = UpstreamOpenvpn::start(
        &ns,
        &tcp_client_config(&pki, port, ControlWrap::TlsAuth, &[]),
        3,
    )
    .expect("client");
    client
        .wait_for_log(INITIALIZED_MARKER, Duration::from_secs(20))
        .expect("client initialized");
    assert!(server.log().contains("Peer Connection Initiated"));
}
