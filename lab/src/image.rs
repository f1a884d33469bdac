//! The container images that `images/build` makes, opened for tests: their configuration
//! (ENTRYPOINT, CMD, ENV, USER, labels) and fresh copies of their root filesystem.
//!
//! [`Image::built`] runs `bash images/build` once per test process (a release build of the two
//! binaries, a no-op when they are current, then a commit that yields the same image ID for the
//! same files) and opens the image whose ID the build wrote to `<target>/images/<name>.iid`.
//! Set `LAB_IMAGES_NO_BUILD=1` to skip the build and use whatever the last one wrote.
//!
//! [`Image::open`] takes any reference buildah knows (name, tag or ID): it copies the image
//! out of buildah's storage with `buildah push … oci:DIR` (uncompressed layers) into a
//! temporary OCI layout, and reads the configuration from there. [`Image::rootfs`] unpacks the
//! layers into a new temporary directory per call (GNU `tar`, owners and modes kept), which
//! is what a container runtime gives each container: its own writable copy. Both
//! directories are removed on drop.
//!
//! Nothing here fetches from a registry: there is none. A missing `buildah` or a missing
//! image is an error that says which command makes it (tests fail loudly, never skip).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde::Deserialize;
use tempfile::TempDir;

use crate::LabError;

/// The images `images/build` makes, by their short names.
pub const IMAGE_NAMES: [&str; 3] = ["vpn-server", "vpn-client", "envoy-proxy"];

/// The command that builds the images, as the errors of this module name it.
pub const BUILD_COMMAND: &str = "bash images/build";

/// Why an image cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// `buildah` is not installed.
    #[error("buildah is not installed: run `bash .ci/deps` (or `apt-get install buildah`)")]
    NoBuildah(#[source] std::io::Error),
    /// buildah does not know the image.
    #[error(
        "image {reference} is not in buildah's storage (`{BUILD_COMMAND}` builds it): {stderr}"
    )]
    Missing {
        /// The reference looked up.
        reference: String,
        /// What buildah said.
        stderr: String,
    },
    /// `images/build` failed (this process runs it once; every later caller gets the same).
    #[error("`{BUILD_COMMAND}` failed: {message}")]
    Build {
        /// Its exit status and the last lines it printed, or why it could not run.
        message: String,
    },
    /// The build wrote no image ID for this image.
    #[error("no image ID for {name} at {}: run `{BUILD_COMMAND}`", path.display())]
    NotBuilt {
        /// The short name (`vpn-server`).
        name: String,
        /// Where the ID was looked for.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// The OCI layout buildah wrote is not what this module understands.
    #[error("image {reference}: {what}")]
    Format {
        /// The image.
        reference: String,
        /// What is wrong.
        what: String,
    },
    /// A lab step (a command, a file) failed.
    #[error(transparent)]
    Lab(#[from] LabError),
}

/// What a container runtime takes from an image's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
    /// `Env`, in order, split at the first `=`.
    pub env: Vec<(String, String)>,
    /// `User` (`uid`, `uid:gid`, or a name); `None` when empty (root).
    pub user: Option<String>,
    /// `WorkingDir`; `None` when empty (`/`).
    pub working_dir: Option<String>,
    /// `Labels`.
    pub labels: BTreeMap<String, String>,
}

/// An image copied out of buildah's storage into a temporary OCI layout; see the module docs.
#[derive(Debug)]
pub struct Image {
    reference: String,
    id: String,
    config: ImageConfig,
    layers: Vec<PathBuf>,
    // Holds the layer blobs; removed on drop.
    _layout: TempDir,
}

impl Image {
    /// Builds the images if needed (once per process; see the module docs) and opens the one
    /// named `name` (one of [`IMAGE_NAMES`]) by the ID the build wrote.
    pub fn built(name: &str) -> Result<Self, ImageError> {
        build_once()?;
        let path = images_dir().join(format!("{name}.iid"));
        let id = std::fs::read_to_string(&path).map_err(|source| ImageError::NotBuilt {
            name: name.to_owned(),
            path: path.clone(),
            source,
        })?;
        Self::open(id.trim())
    }

    /// Opens the image `reference` (a name, tag or ID known to buildah).
    pub fn open(reference: &str) -> Result<Self, ImageError> {
        let layout = tempfile::Builder::new()
            .prefix("vpnt-image-")
            .tempdir()
            .map_err(|e| LabError::io(std::env::temp_dir(), e))?;
        let dest = format!("oci:{}", layout.path().join("layout").display());
        let output = Command::new("buildah")
            .args(["push", "--quiet", "--disable-compression", reference, &dest])
            .stdin(Stdio::null())
            .output()
            .map_err(ImageError::NoBuildah)?;
        if !output.status.success() {
            return Err(ImageError::Missing {
                reference: reference.to_owned(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        let dir = layout.path().join("layout");
        let format = |what: String| ImageError::Format {
            reference: reference.to_owned(),
            what,
        };
        let index: OciIndex = read_json(&dir.join("index.json"), &format)?;
        let [entry] = index.manifests.as_slice() else {
            return Err(format(format!(
                "index.json lists {} manifests, expected 1",
                index.manifests.len()
            )));
        };
        let manifest: OciManifest = read_json(&blob_path(&dir, &entry.digest, &format)?, &format)?;
        let config_file: OciConfigFile =
            read_json(&blob_path(&dir, &manifest.config.digest, &format)?, &format)?;
        let layers = manifest
            .layers
            .iter()
            .map(|layer| blob_path(&dir, &layer.digest, &format))
            .collect::<Result<Vec<_>, _>>()?;
        let c = config_file.config.unwrap_or_default();
        let config = ImageConfig {
            entrypoint: c.entrypoint.unwrap_or_default(),
            cmd: c.cmd.unwrap_or_default(),
            env: c
                .env
                .unwrap_or_default()
                .into_iter()
                .map(|kv| match kv.split_once('=') {
                    Some((k, v)) => (k.to_owned(), v.to_owned()),
                    None => (kv, String::new()),
                })
                .collect(),
            user: c.user.filter(|u| !u.is_empty()),
            working_dir: c.working_dir.filter(|w| !w.is_empty()),
            labels: c.labels.unwrap_or_default(),
        };
        Ok(Self {
            reference: reference.to_owned(),
            id: manifest.config.digest,
            config,
            layers,
            _layout: layout,
        })
    }

    /// The reference the image was opened by.
    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// The image ID (`sha256:…`, the digest of its configuration).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The image's configuration.
    pub fn config(&self) -> &ImageConfig {
        &self.config
    }

    /// A fresh, writable copy of the image's root filesystem, removed on drop.
    ///
    /// The layers are unpacked in order without applying whiteouts: images from
    /// `images/build` have one layer, and [`Rootfs::files`] would show a stray `.wh.` file.
    pub fn rootfs(&self) -> Result<Rootfs, ImageError> {
        let dir = tempfile::Builder::new()
            .prefix("vpnt-rootfs-")
            .tempdir()
            .map_err(|e| LabError::io(std::env::temp_dir(), e))?;
        // tempfile makes the directory 0700; a container's `/` is 0755 (a non-root process
        // must be able to walk it).
        set_mode(dir.path(), 0o755)?;
        for layer in &self.layers {
            let mut tar = Command::new("tar");
            tar.args(["--extract", "--numeric-owner", "--same-owner"])
                .args(["--preserve-permissions", "--file"])
                .arg(layer)
                .arg("--directory")
                .arg(dir.path());
            crate::netns::run_checked(&mut tar)?;
        }
        Ok(Rootfs { dir })
    }
}

/// A writable copy of an image's root filesystem in a temporary directory, removed on drop.
#[derive(Debug)]
pub struct Rootfs {
    dir: TempDir,
}

impl Rootfs {
    /// Where it is on the host.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Every entry below the root, sorted by path: `/`-rooted paths with their kind and mode,
    /// e.g. `/bin/vpn-server f 755`, `/lib d 755`, `/usr/local/bin/envoy l -> /bin/vpn-server`.
    pub fn files(&self) -> Result<Vec<String>, ImageError> {
        let mut out = Vec::new();
        walk(self.dir.path(), self.dir.path(), &mut out)?;
        out.sort();
        Ok(out)
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), LabError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let entries = std::fs::read_dir(dir).map_err(|e| LabError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| LabError::io(dir, e))?;
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).map_err(|e| LabError::io(&path, e))?;
        let rel = Path::new("/").join(path.strip_prefix(root).unwrap_or(&path));
        let owner = if meta.uid() == 0 && meta.gid() == 0 {
            String::new()
        } else {
            format!(" {}:{}", meta.uid(), meta.gid())
        };
        let mode = meta.permissions().mode() & 0o7777;
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&path).map_err(|e| LabError::io(&path, e))?;
            out.push(format!(
                "{} l -> {}{owner}",
                rel.display(),
                target.display()
            ));
        } else if meta.is_dir() {
            out.push(format!("{} d {mode:o}{owner}", rel.display()));
            walk(root, &path, out)?;
        } else {
            out.push(format!("{} f {mode:o}{owner}", rel.display()));
        }
    }
    Ok(())
}

/// Runs `bash images/build` once per process (unless `LAB_IMAGES_NO_BUILD` is set); every
/// caller gets the first run's outcome.
fn build_once() -> Result<(), ImageError> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let outcome = BUILT.get_or_init(|| {
        if std::env::var_os("LAB_IMAGES_NO_BUILD").is_some() {
            return Ok(());
        }
        run_build()
    });
    outcome
        .clone()
        .map_err(|message| ImageError::Build { message })
}

fn run_build() -> Result<(), String> {
    let script = workspace_root().join("images/build");
    let output = Command::new("bash")
        .arg(&script)
        .current_dir(workspace_root())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run bash {}: {e}", script.display()))?;
    if !output.status.success() {
        let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stderr));
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        return Err(format!("{}; its output ends with:\n{tail}", output.status));
    }
    Ok(())
}

/// The workspace this crate belongs to.
fn workspace_root() -> PathBuf {
    let lab = Path::new(env!("CARGO_MANIFEST_DIR"));
    lab.parent().unwrap_or(lab).to_path_buf()
}

/// Where `images/build` writes its outputs: `$CARGO_TARGET_DIR/images`, else
/// `<workspace>/target/images` (as the script decides).
pub fn images_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| {
            if t.is_absolute() {
                t
            } else {
                workspace_root().join(t)
            }
        })
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("images")
}

fn set_mode(path: &Path, mode: u32) -> Result<(), LabError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| LabError::io(path, e))
}

fn read_json<T: serde::de::DeserializeOwned>(
    path: &Path,
    format: &impl Fn(String) -> ImageError,
) -> Result<T, ImageError> {
    let bytes = std::fs::read(path).map_err(|e| LabError::io(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| format(format!("{}: {e}", path.display())))
}

/// The blob file of `digest` (`sha256:<hex>`) in an OCI layout.
fn blob_path(
    layout: &Path,
    digest: &str,
    format: &impl Fn(String) -> ImageError,
) -> Result<PathBuf, ImageError> {
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return Err(format(format!("malformed digest {digest:?}")));
    };
    if algorithm.is_empty() || hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format(format!("malformed digest {digest:?}")));
    }
    Ok(layout.join("blobs").join(algorithm).join(hex))
}

// The parts of the OCI image layout, manifest and configuration read here.

#[derive(Debug, Deserialize)]
struct OciIndex {
    manifests: Vec<OciDescriptor>,
}

#[derive(Debug, Deserialize)]
struct OciDescriptor {
    digest: String,
}

#[derive(Debug, Deserialize)]
struct OciManifest {
    config: OciDescriptor,
    layers: Vec<OciDescriptor>,
}

#[derive(Debug, Deserialize)]
struct OciConfigFile {
    config: Option<OciConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct OciConfig {
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    env: Option<Vec<String>>,
    user: Option<String>,
    working_dir: Option<String>,
    labels: Option<BTreeMap<String, String>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oci_configuration_reads_as_a_runtime_does() {
        let json = r#"{"created":"2026-11-25T00:00:00Z","architecture":"amd64","os":"linux",
            "config":{"User":"65532:65532","Env":["PATH=/usr/local/bin:/bin","EMPTY","A=b=c"],
            "Entrypoint":["/usr/local/bin/envoy"],"WorkingDir":"/","Labels":{"k":"v"}},
            "rootfs":{"type":"layers","diff_ids":[]}}"#;
        let file: OciConfigFile = serde_json::from_str(json).expect("parses");
        let c = file.config.expect("config");
        assert_eq!(c.user.as_deref(), Some("65532:65532"));
        assert_eq!(c.entrypoint, Some(vec!["/usr/local/bin/envoy".to_owned()]));
        assert_eq!(c.cmd, None);
        assert_eq!(c.env.map(|e| e.len()), Some(3));
    }

    #[test]
    fn digests_map_to_blob_files_and_malformed_ones_are_refused() {
        let format = |what: String| ImageError::Format {
            reference: "x".to_owned(),
            what,
        };
        let path = blob_path(Path::new("/l"), "sha256:ab12", &format).expect("valid");
        assert_eq!(path, Path::new("/l/blobs/sha256/ab12"));
        for bad in ["ab12", "sha256:", ":ab", "sha256:../../etc"] {
            assert!(blob_path(Path::new("/l"), bad, &format).is_err(), "{bad}");
        }
    }
}
