//! The `vpn-pki` command: argument model (clap derive, every flag also an environment variable)
//! and [`run`]. The binary only parses, reads the clock and reports errors; tests drive [`run`]
//! directly.
//!
//! Files in the PKI directory (`--dir`, default `./pki`):
//!
//! | file | written by | mode |
//! |---|---|---|
//! | `ca.crt`, `ca.key` | `init` | 0644, 0600 |
//! | `NAME.crt`, `NAME.key` | `issue server|client NAME` | 0644, 0600 |
//! | `ta.key` | `static-key` | 0600 |
//!
//! `bundle NAME --out DIR` writes Gardener's secret layout (`ca.crt`, `tls.crt`, `tls.key`,
//! `vpn.tlsauth`). During a CA rotation, pass the other CA with `--trust FILE` so `ca.crt` holds
//! both. No existing file is replaced without `--force`.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};

use crate::check::is_valid_identity;
use crate::files::{self, FileError, Overwrite, SecretBundle};
use crate::issue::{Ca, CertProfile, IssueError, IssueRequest, San, Validity};
use crate::keys::{KeyError, KeySpec};
use crate::pem::{self, CaBundle, PemError};
use crate::summary::CertSummary;

/// File name of the CA certificate in the PKI directory.
pub const CA_CRT: &str = "ca.crt";
/// File name of the CA key in the PKI directory.
pub const CA_KEY: &str = "ca.key";
/// File name of the static key in the PKI directory.
pub const TA_KEY: &str = "ta.key";

/// Certificates and static keys for the OpenVPN server, its clients and the CONNECT sidecar.
#[derive(Debug, Clone, Parser)]
#[command(name = "vpn-pki", version, about)]
pub struct Cli {
    /// Directory holding the CA, issued certificates and keys, and `ta.key`.
    #[arg(long, env = "VPN_PKI_DIR", default_value = "pki", global = true)]
    pub dir: PathBuf,
    /// Replace files that already exist.
    #[arg(long, env = "VPN_PKI_FORCE", global = true)]
    pub force: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Create a CA (`ca.crt`, `ca.key`).
    Init {
        /// CN of the CA (Gardener's is "vpn").
        #[arg(long, env = "VPN_PKI_CA_CN", default_value = "vpn")]
        cn: String,
        /// Validity in days.
        #[arg(long, env = "VPN_PKI_CA_DAYS", default_value_t = 3650)]
        days: u32,
        /// Use an RSA key of this size (2048 or 3072) instead of ECDSA P-256.
        #[arg(long, env = "VPN_PKI_RSA")]
        rsa: Option<u32>,
    },
    /// Issue a server or client certificate signed by the CA (`NAME.crt`, `NAME.key`).
    Issue {
        /// Server (EKU serverAuth) or client (EKU clientAuth).
        profile: Profile,
        /// The CN, also the file name; for clients the identity OpenVPN sees.
        name: String,
        /// Subject alternative name: a DNS name or IP address, `DNS:` / `IP:` prefixes allowed
        /// (repeat, or comma-separated in the variable). A server without any gets `DNS:NAME`.
        #[arg(long = "san", env = "VPN_PKI_SAN", value_delimiter = ',')]
        sans: Vec<String>,
        /// Validity in days.
        #[arg(long, env = "VPN_PKI_DAYS", default_value_t = 365)]
        days: u32,
        /// Use an RSA key of this size (2048 or 3072) instead of ECDSA P-256.
        #[arg(long, env = "VPN_PKI_RSA")]
        rsa: Option<u32>,
    },
    /// Generate an OpenVPN static key for tls-auth / tls-crypt (`openvpn --genkey secret`
    /// format).
    StaticKey {
        /// Where to write it (default `DIR/ta.key`; `-` for standard output).
        #[arg(long, env = "VPN_PKI_STATIC_KEY_OUT")]
        out: Option<PathBuf>,
    },
    /// Write Gardener's secret layout for NAME: `ca.crt`, `tls.crt`, `tls.key`, `vpn.tlsauth`.
    Bundle {
        /// The issued certificate to bundle (`DIR/NAME.crt`, `DIR/NAME.key`).
        name: String,
        /// Directory to write into (created if missing).
        #[arg(long, env = "VPN_PKI_BUNDLE_OUT")]
        out: PathBuf,
        /// Further trusted CA certificates for `ca.crt`, e.g. the old CA during a rotation
        /// (repeat, or comma-separated in the variable).
        #[arg(long = "trust", env = "VPN_PKI_TRUST", value_delimiter = ',')]
        trust: Vec<PathBuf>,
        /// Static key for `vpn.tlsauth` (default `DIR/ta.key`).
        #[arg(long, env = "VPN_PKI_TLS_AUTH")]
        tls_auth: Option<PathBuf>,
        /// Leave out `vpn.tlsauth`.
        #[arg(long, env = "VPN_PKI_NO_TLS_AUTH", conflicts_with = "tls_auth")]
        no_tls_auth: bool,
    },
    /// Print subject, SANs, key usages, validity and SHA-256 fingerprint of certificates.
    Show {
        /// PEM files (every certificate in each is shown).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

impl Command {
    /// The subcommand's name, for error context.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Init { .. } => "init",
            Command::Issue { .. } => "issue",
            Command::StaticKey { .. } => "static-key",
            Command::Bundle { .. } => "bundle",
            Command::Show { .. } => "show",
        }
    }
}

/// `issue server|client`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Profile {
    /// A server certificate.
    Server,
    /// A client certificate.
    Client,
}

/// Errors of a `vpn-pki` run.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Reading or writing a file failed, or the target exists.
    #[error(transparent)]
    File(#[from] FileError),
    /// A PEM file did not load.
    #[error("{path}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: PemError,
    },
    /// A static key file did not parse.
    #[error("{path}: not an OpenVPN static key")]
    StaticKey {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: protocol::static_key::StaticKeyError,
    },
    /// Building a certificate failed.
    #[error(transparent)]
    Issue(#[from] IssueError),
    /// Key generation or the key size failed.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The certificate name is not usable as a CN and file name.
    #[error("invalid certificate name {name:?}: use letters, digits and -_.@")]
    InvalidName {
        /// The name.
        name: String,
    },
    /// Summarising a certificate failed.
    #[error("{path}: cannot summarise certificate")]
    Summary {
        /// The file.
        path: PathBuf,
        /// OpenSSL's reason.
        #[source]
        source: openssl::error::ErrorStack,
    },
    /// Writing to standard output failed.
    #[error("writing output failed")]
    Output(#[source] std::io::Error),
}

/// Runs one command. `now_unix` is the current time (validity periods start there); messages
/// and `show` output go to `out`.
pub fn run(cli: &Cli, now_unix: i64, out: &mut dyn Write) -> Result<(), CliError> {
    let overwrite = if cli.force {
        Overwrite::Force
    } else {
        Overwrite::Refuse
    };
    let dir = cli.dir.as_path();
    match &cli.command {
        Command::Init { cn, days, rsa } => {
            let ca = Ca::create(cn, key_spec(*rsa)?, Validity::days_from(now_unix, *days))?;
            let (crt, key) = (dir.join(CA_CRT), dir.join(CA_KEY));
            create_dir(dir)?;
            files::ensure_absent([crt.as_path(), key.as_path()], overwrite)?;
            let key_pem = pem::private_key_to_pem(&ca.key().to_owned()).map_err(pem_at(&key))?;
            files::write_secret(&key, &key_pem, overwrite)?;
            let crt_pem = pem::certificates_to_pem([ca.cert()]).map_err(pem_at(&crt))?;
            files::write_public(&crt, &crt_pem, overwrite)?;
            say(
                out,
                format_args!("wrote {} and {}", crt.display(), key.display()),
            )
        }
        Command::Issue {
            profile,
            name,
            sans,
            days,
            rsa,
        } => {
            check_name(name)?;
            let ca = load_ca(dir)?;
            let sans = sans
                .iter()
                .map(|s| s.parse::<San>())
                .collect::<Result<Vec<_>, _>>()?;
            let request = IssueRequest {
                profile: match profile {
                    Profile::Server => CertProfile::Server,
                    Profile::Client => CertProfile::Client,
                },
                common_name: name.clone(),
                sans,
                key: key_spec(*rsa)?,
                validity: Validity::days_from(now_unix, *days),
            };
            let identity = ca.issue(&request)?;
            let crt = dir.join(format!("{name}.crt"));
            let key = dir.join(format!("{name}.key"));
            files::ensure_absent([crt.as_path(), key.as_path()], overwrite)?;
            files::write_secret(&key, &identity.key_pem().map_err(pem_at(&key))?, overwrite)?;
            files::write_public(
                &crt,
                &identity.chain_pem().map_err(pem_at(&crt))?,
                overwrite,
            )?;
            say(
                out,
                format_args!("wrote {} and {}", crt.display(), key.display()),
            )
        }
        Command::StaticKey { out: target } => {
            let key = protocol::static_key::generate(&mut rand_core::OsRng);
            let text = protocol::static_key::write(&key);
            match target.as_deref() {
                Some(p) if p == Path::new("-") => {
                    out.write_all(text.as_bytes()).map_err(CliError::Output)
                }
                target => {
                    let path = match target {
                        Some(p) => p.to_owned(),
                        None => {
                            create_dir(dir)?;
                            dir.join(TA_KEY)
                        }
                    };
                    files::write_secret(&path, text.as_bytes(), overwrite)?;
                    say(out, format_args!("wrote {}", path.display()))
                }
            }
        }
        Command::Bundle {
            name,
            out: target,
            trust,
            tls_auth,
            no_tls_auth,
        } => {
            check_name(name)?;
            let ca_path = dir.join(CA_CRT);
            let mut bundle =
                CaBundle::from_pem(&files::read(&ca_path)?).map_err(pem_at(&ca_path))?;
            for path in trust {
                for cert in pem::certificates(&files::read(path)?).map_err(pem_at(path))? {
                    bundle.push(cert);
                }
            }
            let crt = dir.join(format!("{name}.crt"));
            let key = dir.join(format!("{name}.key"));
            let chain = files::read(&crt)?;
            let key_pem = files::read(&key)?;
            // Refuse a mismatched or unusable pair before writing anything.
            let identity = pem::Identity::from_pem(&chain, &key_pem).map_err(pem_at(&key))?;
            let vpn_tlsauth = if *no_tls_auth {
                None
            } else {
                let path = tls_auth.clone().unwrap_or_else(|| dir.join(TA_KEY));
                let text = files::read(&path)?;
                let parsed = std::str::from_utf8(&text)
                    .map_err(|_| protocol::static_key::StaticKeyError::MissingHeader)
                    .and_then(protocol::static_key::parse);
                if let Err(source) = parsed {
                    return Err(CliError::StaticKey { path, source });
                }
                Some(text)
            };
            let secret = SecretBundle {
                ca_crt: bundle.to_pem().map_err(pem_at(&ca_path))?,
                tls_crt: identity.chain_pem().map_err(pem_at(&crt))?,
                tls_key: key_pem,
                vpn_tlsauth,
            };
            secret.write_to(target, overwrite)?;
            say(
                out,
                format_args!(
                    "wrote {} ({} trusted CA{})",
                    target.display(),
                    bundle.certs().len(),
                    if bundle.certs().len() == 1 { "" } else { "s" }
                ),
            )
        }
        Command::Show { files: paths } => {
            for (i, path) in paths.iter().enumerate() {
                let certs = pem::certificates(&files::read(path)?).map_err(pem_at(path))?;
                for (j, cert) in certs.iter().enumerate() {
                    let summary = CertSummary::of(cert).map_err(|source| CliError::Summary {
                        path: path.clone(),
                        source,
                    })?;
                    if i + j > 0 {
                        say(out, format_args!(""))?;
                    }
                    say(out, format_args!("# {} [{j}]", path.display()))?;
                    say(out, format_args!("{summary}"))?;
                }
            }
            Ok(())
        }
    }
}

fn key_spec(rsa: Option<u32>) -> Result<KeySpec, KeyError> {
    rsa.map_or(Ok(KeySpec::EcdsaP256), KeySpec::rsa)
}

/// The name becomes a file name and a CN; the client-identity rule keeps both safe.
fn check_name(name: &str) -> Result<(), CliError> {
    if is_valid_identity(name) {
        Ok(())
    } else {
        Err(CliError::InvalidName {
            name: name.to_owned(),
        })
    }
}

fn load_ca(dir: &Path) -> Result<Ca, CliError> {
    let crt = dir.join(CA_CRT);
    let key = dir.join(CA_KEY);
    let cert = pem::certificates(&files::read(&crt)?)
        .map_err(pem_at(&crt))?
        .remove(0);
    let key_pem = pem::private_key(&files::read(&key)?).map_err(pem_at(&key))?;
    Ok(Ca::from_parts(cert, key_pem)?)
}

fn create_dir(dir: &Path) -> Result<(), CliError> {
    std::fs::create_dir_all(dir).map_err(|source| {
        CliError::File(FileError::Io {
            path: dir.to_owned(),
            source,
        })
    })
}

fn pem_at(path: &Path) -> impl FnOnce(PemError) -> CliError + '_ {
    move |source| CliError::Pem {
        path: path.to_owned(),
        source,
    }
}

fn say(out: &mut dyn Write, args: std::fmt::Arguments<'_>) -> Result<(), CliError> {
    writeln!(out, "{args}").map_err(CliError::Output)
}
