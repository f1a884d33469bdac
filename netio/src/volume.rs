//! The files of a directory read as one version: a Kubernetes ConfigMap or Secret volume, or a
//! plain directory. `vpn-router --config-dir` and `vpn-client cloud-api --connections` read
//! their directories with [`read`].
//!
//! A ConfigMap or Secret volume holds the files in a directory `..<timestamp>/`, a link
//! `..data` to it, and a link `<name> -> ..data/<name>` per file. The kubelet writes a new
//! version as a new directory, renames a new link over `..data` in one step, then makes the
//! links of new names, removes those of removed names, and removes the old directory. It
//! never changes a version in place.
//!
//! So a read resolves `..data` once, reads, and resolves it again: if it names another version
//! now (or the version was removed under the read), the read may hold a mix of two versions and
//! is done again, at most [`TRIES`] times. Which names are read is the caller's choice
//! ([`Listing`]). A directory without `..data` is read as it is, its files through their links.
//!
//! ```text
//!  DIR/
//!    ..2026_11_26_02_00_00.1/seed.toml     a version
//!    ..data -> ..2026_11_26_02_00_00.1     the version in force
//!    seed.toml -> ..data/seed.toml         what a reader of DIR sees
//! ```

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// Kubernetes' link to the version of an atomically written volume in force.
pub const DATA_LINK: &str = "..data";

/// A read that finds `..data` moved (or its version gone) is done again, up to this many reads
/// in all; the kubelet swaps versions seconds apart at most, so a second read almost always
/// sees one version.
pub const TRIES: usize = 3;

/// Which names of a directory are read, and how an entry that cannot be read counts.
///
/// In both, a name counts only if it does not start with a dot (Kubernetes' `..data` and
/// `..<timestamp>` entries, editors' temporary files) and ends in `.` and the extension, and
/// only regular files (after links) are read: directories are skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// The names in the version `..data` names, read from there: a name is there as soon as
    /// its version is in force, before the kubelet links it, and gone with its version. A file
    /// of the version that cannot be read fails the read (or, gone, repeats it). Without
    /// `..data`, the names in the directory, read through their links: a name whose link
    /// dangles or that vanishes is skipped, other errors fail the read.
    Version,
    /// The names in the directory itself, read through their links (`name -> ..data/name` in a
    /// volume): an entry that cannot be read for any reason (a dangling link, no permission)
    /// is skipped.
    Links,
}

/// The files of one read: their bytes by name, and the version they were read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Each file's bytes, by name.
    pub files: BTreeMap<String, Vec<u8>>,
    /// The wanted files over the bound of [`read_bounded`], not read: their sizes, by name.
    pub too_large: BTreeMap<String, u64>,
    /// The target of `..data` while the files were read (`None`: no `..data`, a plain
    /// directory).
    pub version: Option<PathBuf>,
}

/// Reads the files of `dir` whose names end in `.extension` as one version (see the module
/// docs): their bytes by name, and the `..data` target they were read from.
///
/// Fails if `dir` cannot be listed, if an entry fails as `listing` says, or if `..data` moved
/// during each of [`TRIES`] reads.
pub fn read(dir: &Path, extension: &str, listing: Listing) -> io::Result<Snapshot> {
    read_with(dir, extension, listing, u64::MAX, &mut || {})
}

/// [`read`], but a file of more than `max_bytes` is not read: it is listed in
/// [`Snapshot::too_large`] with its size, for the caller to refuse (a configuration file of
/// several MiB is a mistake or an attack; reading it whole costs memory and, quoted in a
/// refusal, log space).
pub fn read_bounded(
    dir: &Path,
    extension: &str,
    listing: Listing,
    max_bytes: u64,
) -> io::Result<Snapshot> {
    read_with(dir, extension, listing, max_bytes, &mut || {})
}

/// The most bytes a configuration, certificate, key or CCD file of ours may have: what a
/// Kubernetes ConfigMap or Secret holds. A larger one is a mistake or an attack; it is refused
/// unread, with its size ([`read_file_bounded`]).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// [`read_file_bounded`] as text: a file that is not UTF-8 fails as with
/// [`std::fs::read_to_string`] (kind [`io::ErrorKind::InvalidData`]).
pub fn read_text_bounded(path: &Path, max_bytes: u64) -> io::Result<String> {
    String::from_utf8(read_file_bounded(path, max_bytes)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

/// Reads the file at `path` unless it has more than `max_bytes`: then an error of kind
/// [`io::ErrorKind::InvalidData`] naming its size and the bound. Reads at most one byte past
/// the bound, so a file that grows meanwhile is refused too.
pub fn read_file_bounded(path: &Path, max_bytes: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    let mut bytes = Vec::new();
    if size <= max_bytes {
        file.take(max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)?;
    }
    let read = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if size > max_bytes || read > max_bytes {
        return Err(too_large(size.max(read), max_bytes));
    }
    Ok(bytes)
}

/// The error of a file of `size` bytes over the bound `max_bytes`.
fn too_large(size: u64, max_bytes: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{size} bytes, more than the {max_bytes} bytes a file may have"),
    )
}

/// The target of `dir/..data` now (`None`: no such link). A volume whose version is the one
/// a [`Snapshot`] was read from has not changed since.
pub fn version(dir: &Path) -> Option<PathBuf> {
    std::fs::read_link(dir.join(DATA_LINK)).ok()
}

/// [`read`], calling `during` after the files of each try are read and before `..data` is
/// checked again (tests swap versions there).
fn read_with(
    dir: &Path,
    extension: &str,
    listing: Listing,
    max_bytes: u64,
    during: &mut dyn FnMut(),
) -> io::Result<Snapshot> {
    for _ in 0..TRIES {
        if let Some(snapshot) = read_once(dir, extension, listing, max_bytes, during)? {
            return Ok(snapshot);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("{DATA_LINK} named another version at the end of each of {TRIES} reads"),
    ))
}

/// One try: the snapshot, or `None` if `..data` moved (or its version went) meanwhile.
fn read_once(
    dir: &Path,
    extension: &str,
    listing: Listing,
    max_bytes: u64,
    during: &mut dyn FnMut(),
) -> io::Result<Option<Snapshot>> {
    let link = version(dir);
    let root = match (&link, listing) {
        (Some(target), Listing::Version) => dir.join(target),
        _ => dir.to_owned(),
    };
    // Errors of a versioned read fail it: the version's files are all there until the
    // kubelet removes the version, which it does only after `..data` left it.
    let strict = link.is_some() && listing == Listing::Version;
    let (files, too_large) = match read_files(&root, extension, listing, strict, max_bytes) {
        Ok(read) => read,
        Err(e) if strict && e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    during();
    // The version read must still be the one in force: a directory removed while it is
    // listed may list short, and links followed after a swap lead into the new version.
    if version(dir) != link {
        return Ok(None);
    }
    Ok(Some(Snapshot {
        files,
        too_large,
        version: link,
    }))
}

/// The wanted files directly in `root`, by name, and the sizes of those over `max_bytes`
/// (not read). `strict`: every error fails the read; otherwise [`Listing::Version`] skips
/// what vanished and [`Listing::Links`] what it cannot read.
fn read_files(
    root: &Path,
    extension: &str,
    listing: Listing,
    strict: bool,
    max_bytes: u64,
) -> io::Result<Files> {
    let skipped = |e: &io::Error| {
        !strict && (listing == Listing::Links || e.kind() == io::ErrorKind::NotFound)
    };
    let mut files = BTreeMap::new();
    let mut too_large = BTreeMap::new();
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let wanted = !name.starts_with('.')
            && Path::new(&name).extension().and_then(|e| e.to_str()) == Some(extension);
        if !wanted {
            continue;
        }
        let path = root.join(&name);
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => {}
            // A directory, a socket: not a file.
            Ok(_) => continue,
            Err(e) if skipped(&e) => continue,
            Err(e) => return Err(e),
        }
        match read_file_bounded(&path, max_bytes) {
            Ok(content) => {
                files.insert(name, content);
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                let size =
                    std::fs::metadata(&path).map_or(max_bytes.saturating_add(1), |m| m.len());
                too_large.insert(name, size.max(max_bytes.saturating_add(1)));
            }
            Err(e) if skipped(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok((files, too_large))
}

/// The files read, and the sizes of those over the bound.
type Files = (BTreeMap<String, Vec<u8>>, BTreeMap<String, u64>);

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// Writes version `n` of a volume in `dir` as the kubelet does, with `files`, and makes
    /// the links of their names.
    fn write_version(dir: &Path, n: usize, files: &[(&str, &str)]) {
        let version = format!("..v{n}");
        std::fs::create_dir(dir.join(&version)).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(&version).join(name), text).unwrap();
        }
        symlink(&version, dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join(DATA_LINK)).unwrap();
        for (name, _) in files {
            let _ = symlink(Path::new(DATA_LINK).join(name), dir.join(name));
        }
    }

    fn texts(snapshot: &Snapshot) -> Vec<(&str, &[u8])> {
        snapshot
            .files
            .iter()
            .map(|(n, b)| (n.as_str(), b.as_slice()))
            .collect()
    }

    #[test]
    fn a_swap_during_the_read_is_read_again() {
        for listing in [Listing::Version, Listing::Links] {
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path();
            write_version(d, 1, &[("a.conf", "a1"), ("b.conf", "b1")]);
            let mut swaps = 0;
            let got = read_with(d, "conf", listing, u64::MAX, &mut || {
                if swaps == 0 {
                    write_version(d, 2, &[("a.conf", "a2"), ("b.conf", "b2")]);
                }
                swaps += 1;
            })
            .unwrap();
            assert_eq!(swaps, 2, "{listing:?}");
            assert_eq!(
                texts(&got),
                [("a.conf", &b"a2"[..]), ("b.conf", b"b2")],
                "{listing:?}"
            );
            assert_eq!(got.version.as_deref(), Some(Path::new("..v2")));
            assert_eq!(version(d), got.version);
        }
    }

    #[test]
    fn a_volume_swapped_during_every_read_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_version(d, 1, &[("a.conf", "a1")]);
        let mut n = 1;
        let got = read_with(d, "conf", Listing::Version, u64::MAX, &mut || {
            n += 1;
            write_version(d, n, &[("a.conf", "again")]);
        });
        assert!(got.is_err());
        assert_eq!(n, 1 + TRIES);
    }

    #[test]
    fn a_removed_version_is_read_again_from_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_version(d, 1, &[("a.conf", "a1")]);
        let mut first = true;
        let got = read_with(d, "conf", Listing::Version, u64::MAX, &mut || {
            if std::mem::take(&mut first) {
                write_version(d, 2, &[("a.conf", "a2")]);
                std::fs::remove_dir_all(d.join("..v1")).unwrap();
            }
        })
        .unwrap();
        assert_eq!(texts(&got), [("a.conf", &b"a2"[..])]);
    }

    #[test]
    fn version_lists_the_version_and_links_lists_the_links() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_version(d, 1, &[("a.conf", "a1"), ("b.conf", "b1")]);
        // The kubelet has not linked `c.conf` yet, and `b.conf`'s link is gone.
        std::fs::write(d.join("..v1/c.conf"), "c1").unwrap();
        std::fs::remove_file(d.join("b.conf")).unwrap();
        std::fs::write(d.join("notes.txt"), "not wanted").unwrap();
        std::fs::write(d.join(".hidden.conf"), "hidden").unwrap();
        symlink("..data/gone.conf", d.join("dangling.conf")).unwrap();
        std::fs::create_dir(d.join("dir.conf")).unwrap();
        let got = read(d, "conf", Listing::Version).unwrap();
        assert_eq!(
            texts(&got),
            [("a.conf", &b"a1"[..]), ("b.conf", b"b1"), ("c.conf", b"c1")]
        );
        assert_eq!(got.version.as_deref(), Some(Path::new("..v1")));
        let got = read(d, "conf", Listing::Links).unwrap();
        assert_eq!(texts(&got), [("a.conf", &b"a1"[..])]);
    }

    #[test]
    fn a_plain_directory_is_read_through_its_links() {
        for listing in [Listing::Version, Listing::Links] {
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path();
            std::fs::write(d.join("a.toml"), "a").unwrap();
            std::fs::write(d.join("target.txt"), "linked").unwrap();
            symlink(d.join("target.txt"), d.join("b.toml")).unwrap();
            symlink(d.join("gone"), d.join("dangling.toml")).unwrap();
            std::fs::create_dir(d.join("dir.toml")).unwrap();
            std::fs::write(d.join("a.toml~"), "backup").unwrap();
            let got = read(d, "toml", listing).unwrap();
            assert_eq!(
                texts(&got),
                [("a.toml", &b"a"[..]), ("b.toml", b"linked")],
                "{listing:?}"
            );
            assert_eq!(got.version, None);
            assert!(read(&d.join("missing"), "toml", listing).is_err());
        }
    }

    #[test]
    fn a_bounded_read_lists_larger_files_with_their_size_unread() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("small.conf"), "12345").unwrap();
        std::fs::write(d.join("large.conf"), "123456").unwrap();
        let got = read_bounded(d, "conf", Listing::Version, 5).unwrap();
        assert_eq!(texts(&got), vec![("small.conf", &b"12345"[..])]);
        assert_eq!(
            got.too_large,
            BTreeMap::from([("large.conf".to_owned(), 6)])
        );
        let err = read_file_bounded(&d.join("large.conf"), 5).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(
            err.to_string(),
            "6 bytes, more than the 5 bytes a file may have"
        );
        assert_eq!(
            read_file_bounded(&d.join("small.conf"), 5).unwrap(),
            b"12345"
        );
        // Unbounded, both are read.
        assert_eq!(read(d, "conf", Listing::Version).unwrap().files.len(), 2);
    }
}
