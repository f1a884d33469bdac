//! The `vpn-pki` command: through [`pki::cli::run`] and, for flags and environment variables,
//! through the built binary.

#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use clap::Parser;
use pki::check::{check_remote_cert_tls, client_identity, RemoteCertTls};
use pki::cli::{run, Cli, CliError};
use pki::files::FileError;
use pki::pem::{self, CaBundle, Identity, PemError};

const NOW: i64 = 1_767_225_600;

fn vpn_pki(dir: &Path, args: &[&str]) -> Result<String, CliError> {
    let mut argv = vec!["vpn-pki", "--dir", dir.to_str().unwrap()];
    argv.extend_from_slice(args);
    let cli = Cli::try_parse_from(argv).unwrap();
    let mut out = Vec::new();
    run(&cli, NOW, &mut out)?;
    Ok(String::from_utf8(out).unwrap())
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn init_issue_static_key_bundle_show() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pki");
    vpn_pki(&dir, &["init"]).unwrap();
    assert_eq!(mode(&dir.join("ca.key")), 0o600);
    assert_eq!(mode(&dir.join("ca.crt")), 0o644);
    vpn_pki(
        &dir,
        &[
            "issue",
            "server",
            "vpn-seed-server",
            "--san",
            "vpn-seed-server.shoot--p--s.svc",
            "--san",
            "IP:127.0.0.1",
        ],
    )
    .unwrap();
    vpn_pki(
        &dir,
        &["issue", "client", "vpn-shoot-client", "--rsa", "2048"],
    )
    .unwrap();
    vpn_pki(&dir, &["static-key"]).unwrap();
    assert_eq!(mode(&dir.join("vpn-seed-server.key")), 0o600);
    assert_eq!(mode(&dir.join("ta.key")), 0o600);
    let ta = std::fs::read_to_string(dir.join("ta.key")).unwrap();
    protocol::static_key::parse(&ta).unwrap();

    let secret = tmp.path().join("vpn-seed-server");
    let msg = vpn_pki(
        &dir,
        &[
            "bundle",
            "vpn-seed-server",
            "--out",
            secret.to_str().unwrap(),
        ],
    )
    .unwrap();
    assert!(msg.contains("1 trusted CA"), "{msg}");
    for (file, m) in [
        ("ca.crt", 0o644),
        ("tls.crt", 0o644),
        ("tls.key", 0o600),
        ("vpn.tlsauth", 0o600),
    ] {
        assert_eq!(mode(&secret.join(file)), m, "{file}");
    }
    assert_eq!(
        std::fs::read_to_string(secret.join("vpn.tlsauth")).unwrap(),
        ta
    );
    let server = Identity::from_pem(
        &std::fs::read(secret.join("tls.crt")).unwrap(),
        &std::fs::read(secret.join("tls.key")).unwrap(),
    )
    .unwrap();
    let trust = CaBundle::from_pem(&std::fs::read(secret.join("ca.crt")).unwrap()).unwrap();
    trust.verify(server.leaf(), &[], Some(NOW)).unwrap();
    check_remote_cert_tls(server.leaf(), RemoteCertTls::Server).unwrap();

    let client = pem::certificates(&std::fs::read(dir.join("vpn-shoot-client.crt")).unwrap())
        .unwrap()
        .remove(0);
    assert_eq!(client_identity(&client).unwrap(), "vpn-shoot-client");
    check_remote_cert_tls(&client, RemoteCertTls::Client).unwrap();

    let shown = vpn_pki(
        &dir,
        &[
            "show",
            dir.join("vpn-seed-server.crt").to_str().unwrap(),
            dir.join("vpn-shoot-client.crt").to_str().unwrap(),
        ],
    )
    .unwrap();
    for needle in [
        "subject:     CN=vpn-seed-server",
        "issuer:      CN=vpn",
        "SANs:        DNS:vpn-seed-server.shoot--p--s.svc, IP:127.0.0.1",
        "ext. usage:  serverAuth",
        "ext. usage:  clientAuth",
        "public key:  RSA 2048",
        "not after:   Jan  1 00:00:00 2027 GMT",
        "SHA-256:     ",
    ] {
        assert!(shown.contains(needle), "{needle:?} missing from\n{shown}");
    }
}

#[test]
fn nothing_is_overwritten_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    vpn_pki(dir, &["init"]).unwrap();
    let ca_before = std::fs::read(dir.join("ca.crt")).unwrap();
    let err = vpn_pki(dir, &["init"]).unwrap_err();
    assert!(
        matches!(err, CliError::File(FileError::Exists { .. })),
        "{err}"
    );
    assert_eq!(std::fs::read(dir.join("ca.crt")).unwrap(), ca_before);

    vpn_pki(dir, &["issue", "client", "c1"]).unwrap();
    assert!(vpn_pki(dir, &["issue", "client", "c1"]).is_err());
    vpn_pki(dir, &["static-key"]).unwrap();
    assert!(vpn_pki(dir, &["static-key"]).is_err());
    vpn_pki(dir, &["--force", "static-key"]).unwrap();

    vpn_pki(dir, &["--force", "init"]).unwrap();
    assert_ne!(std::fs::read(dir.join("ca.crt")).unwrap(), ca_before);
    assert_eq!(mode(&dir.join("ca.key")), 0o600);
}

#[test]
fn bundle_during_rotation_trusts_both_cas() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pki");
    vpn_pki(&dir, &["init"]).unwrap();
    vpn_pki(&dir, &["static-key"]).unwrap();
    vpn_pki(&dir, &["issue", "client", "old-client"]).unwrap();
    let old_ca = tmp.path().join("old-ca.crt");
    std::fs::copy(dir.join("ca.crt"), &old_ca).unwrap();
    // Rotate: new CA, new server certificate; the bundle trusts old and new.
    vpn_pki(&dir, &["--force", "init"]).unwrap();
    vpn_pki(&dir, &["issue", "server", "vpn-seed-server"]).unwrap();
    let out = tmp.path().join("secret");
    let msg = vpn_pki(
        &dir,
        &[
            "bundle",
            "vpn-seed-server",
            "--out",
            out.to_str().unwrap(),
            "--trust",
            old_ca.to_str().unwrap(),
        ],
    )
    .unwrap();
    assert!(msg.contains("2 trusted CAs"), "{msg}");
    let trust = CaBundle::from_pem(&std::fs::read(out.join("ca.crt")).unwrap()).unwrap();
    let old_client = pem::certificates(&std::fs::read(dir.join("old-client.crt")).unwrap())
        .unwrap()
        .remove(0);
    let new_server = pem::certificates(&std::fs::read(out.join("tls.crt")).unwrap())
        .unwrap()
        .remove(0);
    trust.verify(&old_client, &[], Some(NOW)).unwrap();
    trust.verify(&new_server, &[], Some(NOW)).unwrap();
}

#[test]
fn refuses_bad_inputs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // No CA yet.
    assert!(matches!(
        vpn_pki(dir, &["issue", "server", "s"]),
        Err(CliError::File(FileError::Io { .. }))
    ));
    vpn_pki(dir, &["init", "--rsa", "3072"]).unwrap();
    assert!(matches!(
        vpn_pki(dir, &["issue", "server", "../evil"]),
        Err(CliError::InvalidName { .. })
    ));
    assert!(vpn_pki(dir, &["issue", "server", "s", "--rsa", "1024"]).is_err());
    assert!(vpn_pki(dir, &["issue", "server", "s", "--san", "not a name"]).is_err());
    // An encrypted CA key is refused with a clear message.
    let key = pem::private_key(&std::fs::read(dir.join("ca.key")).unwrap()).unwrap();
    let encrypted = key
        .private_key_to_pem_pkcs8_passphrase(openssl::symm::Cipher::aes_256_cbc(), b"pw")
        .unwrap();
    std::fs::write(dir.join("ca.key"), encrypted).unwrap();
    let err = vpn_pki(dir, &["issue", "server", "s"]).unwrap_err();
    assert!(
        matches!(
            err,
            CliError::Pem {
                source: PemError::KeyEncrypted,
                ..
            }
        ),
        "{err}"
    );
    // A bundle refuses a broken static key before writing anything.
    std::fs::write(dir.join("ca.key"), pem::private_key_to_pem(&key).unwrap()).unwrap();
    vpn_pki(dir, &["issue", "client", "c"]).unwrap();
    std::fs::write(
        dir.join("ta.key"),
        "#\n-----BEGIN OpenVPN Static key V1-----\nabc\n",
    )
    .unwrap();
    let out = dir.join("out");
    let err = vpn_pki(dir, &["bundle", "c", "--out", out.to_str().unwrap()]).unwrap_err();
    assert!(matches!(err, CliError::StaticKey { .. }), "{err}");
    assert!(!out.join("ca.crt").exists());
    vpn_pki(
        dir,
        &[
            "bundle",
            "c",
            "--out",
            out.to_str().unwrap(),
            "--no-tls-auth",
        ],
    )
    .unwrap();
    assert!(!out.join("vpn.tlsauth").exists());
}

#[test]
fn binary_reads_environment_and_reports_errors_with_context() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_vpn-pki");
    let ok = Command::new(bin)
        .env("VPN_PKI_DIR", tmp.path())
        .env("VPN_PKI_CA_CN", "test-ca")
        .arg("init")
        .output()
        .unwrap();
    assert!(ok.status.success(), "{ok:?}");
    let ok = Command::new(bin)
        .env("VPN_PKI_DIR", tmp.path())
        .env("VPN_PKI_SAN", "a.example,IP:10.0.0.1")
        .args(["issue", "server", "srv"])
        .output()
        .unwrap();
    assert!(ok.status.success(), "{ok:?}");
    let shown = Command::new(bin)
        .args(["show"])
        .arg(tmp.path().join("srv.crt"))
        .output()
        .unwrap();
    let shown = String::from_utf8(shown.stdout).unwrap();
    assert!(shown.contains("issuer:      CN=test-ca"), "{shown}");
    assert!(shown.contains("DNS:a.example, IP:10.0.0.1"), "{shown}");
    let stdout_key = Command::new(bin)
        .args(["static-key", "--out", "-"])
        .output()
        .unwrap();
    protocol::static_key::parse(&String::from_utf8(stdout_key.stdout).unwrap()).unwrap();
    let fail = Command::new(bin)
        .env("VPN_PKI_DIR", tmp.path())
        .arg("init")
        .output()
        .unwrap();
    assert!(!fail.status.success());
    let stderr = String::from_utf8_lossy(&fail.stderr);
    assert!(stderr.contains("vpn-pki init failed"), "{stderr}");
    assert!(
        stderr.contains("exists (use --force to overwrite)"),
        "{stderr}"
    );
}
