//! Upstream OpenVPN 2.6 against material made by `vpn-pki` (through `pki::cli::run`, the code the
//! binary runs), in a lab namespace on loopback:
//!
//! * server and client certificates, CA bundle and `vpn.tlsauth` in Gardener's secret layout
//!   bring a tunnel up;
//! * upstream refuses a client certificate presented as server (`remote-cert-tls server`), an
//!   expired certificate and a certificate from another CA, and our checks refuse the same;
//! * `vpn-pki static-key` and `openvpn --genkey secret` write the same format and each side
//!   reads the other's key.

#![allow(clippy::unwrap_used)] // Integration tests are not `cfg(test)`, so `allow-unwrap-in-tests` misses them.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use conformance::netns::Netns;
use conformance::require_lab;
use conformance::upstream::{UpstreamOpenvpn, INITIALIZED_MARKER};
use pki::check::{check_remote_cert_tls, client_identity, CertCheckError, RemoteCertTls};
use pki::pem::{self, CaBundle, VerifyError};

const DAY: i64 = 86_400;

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Runs `vpn-pki --dir DIR ARGS...` as if at `at_unix`.
fn vpn_pki_at(dir: &Path, at_unix: i64, args: &[&str]) {
    let mut argv = vec!["vpn-pki", "--dir", dir.to_str().unwrap()];
    argv.extend_from_slice(args);
    let cli = pki::cli::Cli::try_parse_from(&argv).unwrap();
    pki::cli::run(&cli, at_unix, &mut std::io::sink())
        .unwrap_or_else(|e| panic!("vpn-pki {argv:?}: {e}"));
}

fn vpn_pki(dir: &Path, args: &[&str]) {
    vpn_pki_at(dir, now(), args);
}

/// A PKI directory with a CA, `ta.key`, the server `vpn-seed-server` and the client
/// `vpn-shoot-client`, each bundled into `<root>/<name>/` (ca.crt, tls.crt, tls.key,
/// vpn.tlsauth).
struct Material {
    root: tempfile::TempDir,
}

impl Material {
    fn new() -> Material {
        let root = tempfile::Builder::new()
            .prefix("vpnt-pki-")
            .tempdir()
            .unwrap();
        let m = Material { root };
        let dir = m.pki();
        vpn_pki(&dir, &["init"]);
        vpn_pki(&dir, &["static-key"]);
        vpn_pki(&dir, &["issue", "server", "vpn-seed-server"]);
        vpn_pki(&dir, &["issue", "client", "vpn-shoot-client"]);
        m.bundle("vpn-seed-server");
        m.bundle("vpn-shoot-client");
        m
    }

    fn pki(&self) -> PathBuf {
        self.root.path().join("pki")
    }

    fn secret(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    fn bundle(&self, name: &str) {
        let out = self.secret(name);
        vpn_pki(
            &self.pki(),
            &["--force", "bundle", name, "--out", out.to_str().unwrap()],
        );
    }
}

fn server_config(secret: &Path, port: u16) -> String {
    let f = |n: &str| secret.join(n).display().to_string();
    format!(
        "proto tcp-server\nlocal 127.0.0.1\nport {port}\ndev tun\ntopology subnet\n\
         server 192.168.123.0 255.255.255.0\nkeepalive 10 60\n\
         ca {}\ncert {}\nkey {}\ndh none\ntls-auth {} 0\nremote-cert-tls client\n",
        f("ca.crt"),
        f("tls.crt"),
        f("tls.key"),
        f("vpn.tlsauth")
    )
}

fn client_config(secret: &Path, port: u16) -> String {
    let f = |n: &str| secret.join(n).display().to_string();
    format!(
        "client\nproto tcp-client\nremote 127.0.0.1 {port}\ndev tun\nnobind\n\
         ca {}\ncert {}\nkey {}\nremote-cert-tls server\ntls-auth {} 1\n",
        f("ca.crt"),
        f("tls.crt"),
        f("tls.key"),
        f("vpn.tlsauth")
    )
}

const PORT: u16 = 11950;

/// Starts an upstream server from `server_secret` (once it listens) and a client from
/// `client_secret`.
fn run_pair<'ns>(
    ns: &'ns Netns,
    server_secret: &Path,
    client_secret: &Path,
) -> (UpstreamOpenvpn<'ns>, UpstreamOpenvpn<'ns>) {
    let server = UpstreamOpenvpn::start(ns, &server_config(server_secret, PORT), 3).unwrap();
    server.wait_listening(Duration::from_secs(10)).unwrap();
    let client = UpstreamOpenvpn::start(ns, &client_config(client_secret, PORT), 3).unwrap();
    (server, client)
}

fn leaf(path: &Path) -> openssl::x509::X509 {
    pem::certificates(&std::fs::read(path).unwrap())
        .unwrap()
        .remove(0)
}

fn bundle(path: &Path) -> CaBundle {
    CaBundle::from_pem(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn pki_upstream_tunnel_comes_up_with_vpn_pki_material() {
    require_lab(&["openvpn"]);
    let m = Material::new();
    let ns = Netns::new().unwrap();
    let (server, client) = run_pair(
        &ns,
        &m.secret("vpn-seed-server"),
        &m.secret("vpn-shoot-client"),
    );
    client
        .wait_for_log(INITIALIZED_MARKER, Duration::from_secs(20))
        .unwrap();
    let log = client.log();
    assert!(log.contains("VERIFY KU OK"), "{log}");
    assert!(log.contains("VERIFY EKU OK"), "{log}");
    server
        .wait_for_log("vpn-shoot-client", Duration::from_secs(5))
        .unwrap();
    // Upstream's identity for the client is the CN, as ours is.
    let ours = client_identity(&leaf(&m.secret("vpn-shoot-client").join("tls.crt"))).unwrap();
    assert!(server
        .log()
        .contains(&format!("[{ours}] Peer Connection Initiated")));
    // The pushed address is on the client's tun device inside the namespace.
    let addrs = ns.run(["ip", "-o", "-4", "addr", "show"]).unwrap();
    let addrs = String::from_utf8_lossy(&addrs.stdout).into_owned();
    assert!(addrs.contains("192.168.123.2/24"), "{addrs}");
}

/// Which upstream peer verifies and so logs the refusal.
#[derive(Debug, Clone, Copy)]
enum Refuser {
    Server,
    Client,
}

/// Waits until `by` logs a verification failure containing `reason`, and checks that no
/// session came up: the client never logged its initialisation, the server never a peer
/// connection (a server logs "Initialization Sequence Completed" for itself at start).
fn expect_refusal(
    server: &UpstreamOpenvpn<'_>,
    client: &UpstreamOpenvpn<'_>,
    by: Refuser,
    reason: &str,
) {
    let who = match by {
        Refuser::Server => server,
        Refuser::Client => client,
    };
    who.wait_for_log(reason, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("expected {reason:?} from the {by:?}: {e}"));
    assert!(who.log().contains("VERIFY ERROR"), "{}", who.log());
    assert!(
        !client.log().contains(INITIALIZED_MARKER),
        "{}",
        client.log()
    );
    assert!(
        !server.log().contains("Peer Connection Initiated"),
        "{}",
        server.log()
    );
}

#[test]
fn pki_upstream_refuses_client_certificate_presented_as_server() {
    require_lab(&["openvpn"]);
    let m = Material::new();
    // The "server" presents a client certificate of the same CA.
    vpn_pki(&m.pki(), &["issue", "client", "impostor"]);
    m.bundle("impostor");
    let ns = Netns::new().unwrap();
    let (server, client) = run_pair(&ns, &m.secret("impostor"), &m.secret("vpn-shoot-client"));
    // OpenSSL's purpose check for a TLS client fires before remote-cert-tls sees the cert.
    expect_refusal(
        &server,
        &client,
        Refuser::Client,
        "unsuitable certificate purpose",
    );
    // Ours: remote-cert-tls server refuses it too.
    let cert = leaf(&m.secret("impostor").join("tls.crt"));
    assert_eq!(
        check_remote_cert_tls(&cert, RemoteCertTls::Server),
        Err(CertCheckError::ExtendedKeyUsageMismatch {
            expected: RemoteCertTls::Server
        })
    );
}

#[test]
fn pki_upstream_refuses_expired_certificate() {
    require_lab(&["openvpn"]);
    let m = Material::new();
    // Issued 30 days ago for 1 day, by the same `issue` code path.
    vpn_pki_at(
        &m.pki(),
        now() - 30 * DAY,
        &[
            "--force",
            "issue",
            "server",
            "vpn-seed-server",
            "--days",
            "1",
        ],
    );
    m.bundle("vpn-seed-server");
    let ns = Netns::new().unwrap();
    let (server, client) = run_pair(
        &ns,
        &m.secret("vpn-seed-server"),
        &m.secret("vpn-shoot-client"),
    );
    expect_refusal(&server, &client, Refuser::Client, "certificate has expired");
    let secret = m.secret("vpn-seed-server");
    let err = bundle(&secret.join("ca.crt"))
        .verify(&leaf(&secret.join("tls.crt")), &[], None)
        .unwrap_err();
    assert_eq!(err.code(), Some(VerifyError::CERT_HAS_EXPIRED), "{err}");
}

#[test]
fn pki_upstream_refuses_certificate_from_another_ca() {
    require_lab(&["openvpn"]);
    let m = Material::new();
    let other = Material::new();
    // The client holds a certificate of another CA (but trusts the right one).
    let mixed = m.secret("foreign-client");
    std::fs::create_dir_all(&mixed).unwrap();
    for f in ["ca.crt", "vpn.tlsauth"] {
        std::fs::copy(m.secret("vpn-shoot-client").join(f), mixed.join(f)).unwrap();
    }
    for f in ["tls.crt", "tls.key"] {
        std::fs::copy(other.secret("vpn-shoot-client").join(f), mixed.join(f)).unwrap();
    }
    let ns = Netns::new().unwrap();
    let (server, client) = run_pair(&ns, &m.secret("vpn-seed-server"), &mixed);
    expect_refusal(
        &server,
        &client,
        Refuser::Server,
        "unable to get local issuer certificate",
    );
    let err = bundle(&m.secret("vpn-seed-server").join("ca.crt"))
        .verify(&leaf(&mixed.join("tls.crt")), &[], None)
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some(VerifyError::UNABLE_TO_GET_ISSUER_CERT_LOCALLY),
        "{err}"
    );
}

/// Keys as OpenVPN reads them: `openvpn --test-crypto --secret FILE 0` at verb 7 logs the key
/// bytes it will use; two files with the same bytes give the same log lines.
fn openvpn_key_lines(path: &Path) -> Vec<String> {
    let out = std::process::Command::new(conformance::upstream::referee())
        .args(["--test-crypto", "--secret"])
        .arg(path)
        .args([
            "0",
            "--cipher",
            "AES-256-CBC",
            "--auth",
            "SHA512",
            "--verb",
            "7",
        ])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<String> = log
        .lines()
        .filter(|l| l.contains("CIPHER KEY:") || l.contains("HMAC KEY:"))
        .map(|l| l.split_once(": ").map(|x| x.1).unwrap_or(l).to_owned())
        .collect();
    assert!(!lines.is_empty(), "openvpn did not read {path:?}:\n{log}");
    lines
}

#[test]
fn pki_static_key_matches_openvpn_genkey() {
    require_lab(&["openvpn"]);
    let tmp = tempfile::tempdir().unwrap();
    let ours = tmp.path().join("ours.key");
    let theirs = tmp.path().join("theirs.key");
    vpn_pki(tmp.path(), &["static-key", "--out", ours.to_str().unwrap()]);
    let status = std::process::Command::new(conformance::upstream::referee())
        .args(["--genkey", "secret"])
        .arg(&theirs)
        .status()
        .unwrap();
    assert!(status.success());
    let ours_text = std::fs::read_to_string(&ours).unwrap();
    let theirs_text = std::fs::read_to_string(&theirs).unwrap();

    // Same format: identical text once the 512 hex digits are blanked out.
    let shape = |t: &str| -> String {
        t.chars()
            .map(|c| if c.is_ascii_hexdigit() { 'x' } else { c })
            .collect()
    };
    assert_eq!(shape(&ours_text), shape(&theirs_text));
    assert_eq!(ours_text.len(), theirs_text.len());

    // We read theirs: rewriting it gives their bytes back.
    let key = protocol::static_key::parse(&theirs_text).unwrap();
    assert_eq!(protocol::static_key::write(&key), theirs_text);
    // They read ours: OpenVPN's key bytes equal the file's.
    let ours_key = protocol::static_key::parse(&ours_text).unwrap();
    let logged = openvpn_key_lines(&ours).join(" ").replace(' ', "");
    let bytes = ours_key.to_bytes();
    // Direction 0 sends with key[0]: cipher bytes 0..32 and HMAC bytes 64..128.
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    assert!(logged.contains(&hex(&bytes[0..32])), "{logged}");
    assert!(logged.contains(&hex(&bytes[64..128])), "{logged}");
    // Mode 0600, like `openvpn --genkey` on a sane umask.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&ours).unwrap().permissions().mode() & 0o777,
        0o600
    );
}
