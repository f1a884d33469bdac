//! Kernel parameters under `/proc/sys`, by their `sysctl` names (`net.ipv4.ip_forward`). The
//! `net.*` ones belong to the network namespace of the process, so a pod's init container
//! sets them for the pod.

use std::io;
use std::path::PathBuf;

/// Why a parameter could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SysctlError {
    /// Reading failed.
    #[error("cannot read {name}")]
    Read {
        /// The parameter.
        name: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Writing failed (usually: not privileged; an init container must be).
    #[error("cannot set {name} to {value:?} (does the container run privileged?)")]
    Write {
        /// The parameter.
        name: String,
        /// The value.
        value: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The file of parameter `name`: dots become slashes (names here never contain a dot of
/// their own, as interface names in `conf.<dev>` could).
pub fn path(name: &str) -> PathBuf {
    PathBuf::from("/proc/sys").join(name.replace('.', "/"))
}

/// The value of `name`, trimmed.
pub fn read(name: &str) -> Result<String, SysctlError> {
    std::fs::read_to_string(path(name))
        .map(|v| v.trim().to_owned())
        .map_err(|source| SysctlError::Read {
            name: name.to_owned(),
            source,
        })
}

/// Sets `name` to `value`.
pub fn write(name: &str, value: &str) -> Result<(), SysctlError> {
    std::fs::write(path(name), value).map_err(|source| SysctlError::Write {
        name: name.to_owned(),
        value: value.to_owned(),
        source,
    })
}

/// Sets every `(name, value)` in order; stops at the first failure.
pub fn write_all(settings: &[(&str, &str)]) -> Result<(), SysctlError> {
    settings.iter().try_for_each(|(n, v)| write(n, v))
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_map_to_proc_sys_paths() {
        assert_eq!(
            super::path("net.ipv6.conf.all.disable_ipv6").to_str(),
            Some("/proc/sys/net/ipv6/conf/all/disable_ipv6")
        );
    }

    #[test]
    fn reading_a_parameter_that_every_kernel_has() {
        let v = super::read("kernel.ostype").expect("readable");
        assert_eq!(v, "Linux");
        let err = super::read("net.no.such.parameter").expect_err("missing");
        assert!(err.to_string().contains("net.no.such.parameter"));
    }
}
