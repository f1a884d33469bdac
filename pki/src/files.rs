//! The only file I/O of the crate: reading PEM files and writing key material with the right
//! modes, never clobbering an existing file unless asked to.
//!
//! Private keys and static keys are written with mode 0600, certificates with 0644. With
//! [`Overwrite::Force`] the new content goes to a temporary file in the same directory (created
//! with the final mode) which then replaces the old one, so a key is never briefly readable.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of private keys and static keys.
pub const MODE_SECRET: u32 = 0o600;
/// Mode of certificates and CA bundles.
pub const MODE_PUBLIC: u32 = 0o644;

/// Gardener's secret layout: the CA bundle.
pub const BUNDLE_CA_CRT: &str = "ca.crt";
/// Gardener's secret layout: the certificate chain.
pub const BUNDLE_TLS_CRT: &str = "tls.crt";
/// Gardener's secret layout: the private key.
pub const BUNDLE_TLS_KEY: &str = "tls.key";
/// Gardener's secret layout: the OpenVPN static key (tls-auth / tls-crypt).
pub const BUNDLE_VPN_TLSAUTH: &str = "vpn.tlsauth";

/// Whether an existing file may be replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overwrite {
    /// Refuse with [`FileError::Exists`] (the default).
    #[default]
    Refuse,
    /// Replace it (`--force`).
    Force,
}

/// Errors reading or writing files.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The target exists and `--force` was not given.
    #[error("{path} exists (use --force to overwrite)")]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// An I/O error on `path`.
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |source| FileError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Reads a whole file.
pub fn read(path: &Path) -> Result<Vec<u8>, FileError> {
    fs::read(path).map_err(io(path))
}

/// Writes a private or static key (mode 0600).
pub fn write_secret(path: &Path, content: &[u8], overwrite: Overwrite) -> Result<(), FileError> {
    write_with_mode(path, content, MODE_SECRET, overwrite)
}

/// Writes a certificate or bundle (mode 0644).
pub fn write_public(path: &Path, content: &[u8], overwrite: Overwrite) -> Result<(), FileError> {
    write_with_mode(path, content, MODE_PUBLIC, overwrite)
}

/// Fails with [`FileError::Exists`] if any of `paths` exists and `overwrite` is `Refuse`, so a
/// command writing several files writes all or none.
pub fn ensure_absent<'a>(
    paths: impl IntoIterator<Item = &'a Path>,
    overwrite: Overwrite,
) -> Result<(), FileError> {
    if overwrite == Overwrite::Force {
        return Ok(());
    }
    for path in paths {
        match fs::symlink_metadata(path) {
            Ok(_) => {
                return Err(FileError::Exists {
                    path: path.to_owned(),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(path)(e)),
        }
    }
    Ok(())
}

fn write_with_mode(
    path: &Path,
    content: &[u8],
    mode: u32,
    overwrite: Overwrite,
) -> Result<(), FileError> {
    match overwrite {
        Overwrite::Refuse => {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(path)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::AlreadyExists => FileError::Exists {
                        path: path.to_owned(),
                    },
                    _ => io(path)(e),
                })?;
            // The mode given to `open` is filtered by the umask; set it exactly.
            f.set_permissions(fs::Permissions::from_mode(mode))
                .map_err(io(path))?;
            f.write_all(content).map_err(io(path))?;
            f.sync_all().map_err(io(path))
        }
        Overwrite::Force => {
            let tmp = temp_path(path);
            let result = (|| {
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(mode)
                    .open(&tmp)
                    .map_err(io(&tmp))?;
                f.set_permissions(fs::Permissions::from_mode(mode))
                    .map_err(io(&tmp))?;
                f.write_all(content).map_err(io(&tmp))?;
                f.sync_all().map_err(io(&tmp))?;
                fs::rename(&tmp, path).map_err(io(path))
            })();
            if result.is_err() {
                let _ = fs::remove_file(&tmp);
            }
            result
        }
    }
}

fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp{}", std::process::id()))
}

/// The contents of one Gardener-style secret directory.
#[derive(Debug, Clone)]
pub struct SecretBundle {
    /// `ca.crt`: the trusted CA bundle (old and new CA during rotation).
    pub ca_crt: Vec<u8>,
    /// `tls.crt`: the certificate chain, leaf first.
    pub tls_crt: Vec<u8>,
    /// `tls.key`: the private key.
    pub tls_key: Vec<u8>,
    /// `vpn.tlsauth`: the OpenVPN static key text, if any.
    pub vpn_tlsauth: Option<Vec<u8>>,
}

impl SecretBundle {
    /// Writes the bundle's files into `dir` (created if missing). Nothing is written if any
    /// target exists and `overwrite` is `Refuse`.
    pub fn write_to(&self, dir: &Path, overwrite: Overwrite) -> Result<(), FileError> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        let mut files: Vec<(PathBuf, &[u8], u32)> = vec![
            (dir.join(BUNDLE_CA_CRT), &self.ca_crt, MODE_PUBLIC),
            (dir.join(BUNDLE_TLS_CRT), &self.tls_crt, MODE_PUBLIC),
            (dir.join(BUNDLE_TLS_KEY), &self.tls_key, MODE_SECRET),
        ];
        if let Some(key) = &self.vpn_tlsauth {
            files.push((dir.join(BUNDLE_VPN_TLSAUTH), key, MODE_SECRET));
        }
        ensure_absent(files.iter().map(|(p, _, _)| p.as_path()), overwrite)?;
        for (path, content, mode) in files {
            write_with_mode(&path, content, mode, overwrite)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn secret_files_are_0600_and_public_0644() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k.key");
        let crt = dir.path().join("c.crt");
        write_secret(&key, b"secret", Overwrite::Refuse).unwrap();
        write_public(&crt, b"public", Overwrite::Refuse).unwrap();
        assert_eq!(mode(&key), 0o600);
        assert_eq!(mode(&crt), 0o644);
        assert_eq!(read(&key).unwrap(), b"secret");
    }

    #[test]
    fn no_overwrite_without_force() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k.key");
        write_secret(&key, b"one", Overwrite::Refuse).unwrap();
        let err = write_secret(&key, b"two", Overwrite::Refuse).unwrap_err();
        assert!(matches!(err, FileError::Exists { .. }), "{err}");
        assert_eq!(read(&key).unwrap(), b"one");
        write_secret(&key, b"two", Overwrite::Force).unwrap();
        assert_eq!(read(&key).unwrap(), b"two");
    }

    #[test]
    fn force_tightens_mode_of_an_existing_key() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k.key");
        fs::write(&key, b"old").unwrap();
        fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
        write_secret(&key, b"new", Overwrite::Force).unwrap();
        assert_eq!(mode(&key), 0o600);
        // No temporary file left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn bundle_writes_all_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = SecretBundle {
            ca_crt: b"ca".to_vec(),
            tls_crt: b"crt".to_vec(),
            tls_key: b"key".to_vec(),
            vpn_tlsauth: Some(b"ta".to_vec()),
        };
        fs::write(dir.path().join(BUNDLE_TLS_KEY), b"existing").unwrap();
        let err = bundle.write_to(dir.path(), Overwrite::Refuse).unwrap_err();
        assert!(matches!(err, FileError::Exists { .. }));
        assert!(!dir.path().join(BUNDLE_CA_CRT).exists());

        bundle.write_to(dir.path(), Overwrite::Force).unwrap();
        assert_eq!(mode(&dir.path().join(BUNDLE_CA_CRT)), 0o644);
        assert_eq!(mode(&dir.path().join(BUNDLE_TLS_CRT)), 0o644);
        assert_eq!(mode(&dir.path().join(BUNDLE_TLS_KEY)), 0o600);
        assert_eq!(mode(&dir.path().join(BUNDLE_VPN_TLSAUTH)), 0o600);
        assert_eq!(read(&dir.path().join(BUNDLE_TLS_KEY)).unwrap(), b"key");
    }
}
