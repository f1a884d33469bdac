//! A throwaway test PKI made with the `openssl` and `openvpn` command-line tools.
//!
//! Test-only: the real certificate code lives in the `pki` crate. The certificates carry what
//! upstream OpenVPN checks with `remote-cert-tls`:
//!
//! | file | key | extensions |
//! |---|---|---|
//! | `ca.crt` | ECDSA P-256 | basicConstraints critical CA:TRUE; KU keyCertSign, cRLSign |
//! | `server.crt` | ECDSA P-256 | KU digitalSignature, keyEncipherment; EKU serverAuth |
//! | `client.crt` | ECDSA P-256 | KU digitalSignature; EKU clientAuth |
//! | `ta.key` | `openvpn --genkey secret` | 2048-bit OpenVPN static key |
//!
//! Our server's and client's settings for this PKI are built in `conformance`
//! (`conformance::our_settings::OurSettings`): this crate does not depend on them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tempfile::TempDir;

use crate::LabError;

/// Extension sections for `openssl x509 -req -extfile`.
const EXTENSIONS: &str = "\
[server]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
[client]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
";

/// CA, server and client certificates and a `ta.key` in a temporary directory that is
/// deleted on drop.
#[derive(Debug)]
pub struct TestPki {
    dir: TempDir,
}

impl TestPki {
    /// Generates a fresh PKI (takes a fraction of a second).
    pub fn generate() -> Result<Self, LabError> {
        let dir = tempfile::Builder::new()
            .prefix("vpnt-pki-")
            .tempdir()
            .map_err(|source| LabError::io(std::env::temp_dir(), source))?;
        let d = dir.path();
        let ext = d.join("ext.cnf");
        std::fs::write(&ext, EXTENSIONS).map_err(|source| LabError::io(&ext, source))?;
        for name in ["ca", "server", "client"] {
            tool(d, "openssl")
                .args(["genpkey", "-algorithm", "EC", "-pkeyopt"])
                .args(["ec_paramgen_curve:P-256", "-out", &format!("{name}.key")])
                .run()?;
        }
        tool(d, "openssl")
            .args([
                "req",
                "-x509",
                "-new",
                "-key",
                "ca.key",
                "-subj",
                "/CN=vpnt-test-ca",
            ])
            .args(["-days", "30", "-out", "ca.crt"])
            .args(["-addext", "basicConstraints=critical,CA:TRUE"])
            .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
            .run()?;
        for (serial, name) in [("2", "server"), ("3", "client")] {
            tool(d, "openssl")
                .args(["req", "-new", "-key", &format!("{name}.key")])
                .args([
                    "-subj",
                    &format!("/CN={name}"),
                    "-out",
                    &format!("{name}.csr"),
                ])
                .run()?;
            tool(d, "openssl")
                .args([
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    "ca.crt",
                ])
                .args(["-CAkey", "ca.key", "-set_serial", serial, "-days", "30"])
                .args(["-extfile", "ext.cnf", "-extensions", name])
                .args(["-out", &format!("{name}.crt")])
                .run()?;
        }
        tool(d, &crate::referee::referee())
            .args(["--genkey", "secret", "ta.key"])
            .run()?;
        Ok(Self { dir })
    }

    /// Issues one more client certificate with common name `cn` from the CA (the extensions of
    /// the fixture's own client certificate), as `<cn>.crt` and `<cn>.key` in [`dir`]; the
    /// serial is derived from `cn`. Returns (cert, key).
    ///
    /// [`dir`]: TestPki::dir
    pub fn issue_client(&self, cn: &str) -> Result<(PathBuf, PathBuf), LabError> {
        let d = self.dir.path();
        let (key, csr, crt) = (
            format!("{cn}.key"),
            format!("{cn}.csr"),
            format!("{cn}.crt"),
        );
        tool(d, "openssl")
            .args(["genpkey", "-algorithm", "EC", "-pkeyopt"])
            .args(["ec_paramgen_curve:P-256", "-out", &key])
            .run()?;
        tool(d, "openssl")
            .args(["req", "-new", "-key", &key, "-subj", &format!("/CN={cn}")])
            .args(["-out", &csr])
            .run()?;
        let serial = (100 + cn.len() + cn.bytes().map(usize::from).sum::<usize>()).to_string();
        tool(d, "openssl")
            .args(["x509", "-req", "-in", &csr, "-CA", "ca.crt"])
            .args(["-CAkey", "ca.key", "-set_serial", &serial, "-days", "30"])
            .args(["-extfile", "ext.cnf", "-extensions", "client", "-out", &crt])
            .run()?;
        Ok((d.join(crt), d.join(key)))
    }

    /// The directory holding all files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// CA certificate (PEM).
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// Server certificate (PEM).
    pub fn server_cert(&self) -> PathBuf {
        self.dir.path().join("server.crt")
    }

    /// Server private key (PEM, unencrypted).
    pub fn server_key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// Client certificate (PEM).
    pub fn client_cert(&self) -> PathBuf {
        self.dir.path().join("client.crt")
    }

    /// Client private key (PEM, unencrypted).
    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }

    /// The OpenVPN static key file for tls-auth / tls-crypt.
    pub fn ta_key(&self) -> PathBuf {
        self.dir.path().join("ta.key")
    }

    /// The text of the static key file.
    pub fn ta_key_text(&self) -> Result<String, LabError> {
        let path = self.ta_key();
        std::fs::read_to_string(&path).map_err(|source| LabError::io(&path, source))
    }
}

/// A command run in `dir` that must succeed.
struct Tool {
    cmd: Command,
}

fn tool(dir: &Path, program: &str) -> Tool {
    let mut cmd = Command::new(program);
    cmd.current_dir(dir).stdin(Stdio::null());
    Tool { cmd }
}

impl Tool {
    fn args<I, S>(&mut self, args: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.cmd.args(args);
        self
    }

    fn run(&mut self) -> Result<(), LabError> {
        crate::netns::run_checked(&mut self.cmd).map(drop)
    }
}
