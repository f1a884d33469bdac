//! Who a container runs as: users, groups and capabilities as containerd computes them, and
//! what `/proc/PID/status` shows of them.

use super::*;

/// The capabilities containerd gives a container by default (its `oci.DefaultCapabilities`;
/// Docker's list is the same).
pub const DEFAULT_CAPABILITIES: CapabilitySet = CapabilitySet::CHOWN
    .union(CapabilitySet::DAC_OVERRIDE)
    .union(CapabilitySet::FSETID)
    .union(CapabilitySet::FOWNER)
    .union(CapabilitySet::MKNOD)
    .union(CapabilitySet::NET_RAW)
    .union(CapabilitySet::SETGID)
    .union(CapabilitySet::SETUID)
    .union(CapabilitySet::SETFCAP)
    .union(CapabilitySet::SETPCAP)
    .union(CapabilitySet::NET_BIND_SERVICE)
    .union(CapabilitySet::SYS_CHROOT)
    .union(CapabilitySet::KILL)
    .union(CapabilitySet::AUDIT_WRITE);

/// A few fields of `/proc/PID/status`: what a test checks of a container's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStatus {
    /// Real, effective, saved and filesystem uid.
    pub uid: [u32; 4],
    /// Real, effective, saved and filesystem gid.
    pub gid: [u32; 4],
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// `CapEff`.
    pub effective: CapabilitySet,
    /// `CapPrm`.
    pub permitted: CapabilitySet,
    /// `CapInh`.
    pub inheritable: CapabilitySet,
    /// `CapBnd`.
    pub bounding: CapabilitySet,
    /// `CapAmb`.
    pub ambient: CapabilitySet,
    /// `NoNewPrivs`.
    pub no_new_privs: bool,
}

impl ProcStatus {
    /// Reads `/proc/PID/status`.
    pub fn read(pid: u32) -> Result<Self, LabError> {
        let path = format!("/proc/{pid}/status");
        let text = std::fs::read_to_string(&path).map_err(|e| LabError::io(&path, e))?;
        let bad = |what: &str| {
            LabError::io(
                &path,
                std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned()),
            )
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
                .ok_or_else(|| bad(name))
        };
        let ids = |name: &str| -> Result<[u32; 4], LabError> {
            let v: Vec<u32> = field(name)?
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|_| bad(name))?;
            v.try_into().map_err(|_| bad(name))
        };
        let caps = |name: &str| -> Result<CapabilitySet, LabError> {
            u64::from_str_radix(field(name)?, 16)
                .map(CapabilitySet::from_bits_retain)
                .map_err(|_| bad(name))
        };
        Ok(Self {
            uid: ids("Uid")?,
            gid: ids("Gid")?,
            groups: field("Groups")?
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|_| bad("Groups"))?,
            effective: caps("CapEff")?,
            permitted: caps("CapPrm")?,
            inheritable: caps("CapInh")?,
            bounding: caps("CapBnd")?,
            ambient: caps("CapAmb")?,
            no_new_privs: field("NoNewPrivs")? == "1",
        })
    }
}

/// Every capability a container can get here: those this kernel knows that the lab process
/// itself holds (a runtime cannot give more; a sandboxed "root" may lack some). What a
/// privileged container gets.
pub fn all_capabilities() -> CapabilitySet {
    let held = rustix::thread::capabilities(None)
        .map(|sets| sets.permitted)
        .unwrap_or(CapabilitySet::empty());
    kernel_capabilities() & held
}

/// Every capability this kernel knows (0 ..= `/proc/sys/kernel/cap_last_cap`).
pub(super) fn kernel_capabilities() -> CapabilitySet {
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(40)
        .min(63);
    CapabilitySet::from_bits_retain(if last == 63 {
        u64::MAX
    } else {
        (1u64 << (last + 1)) - 1
    })
}

/// A capability by its Kubernetes name (`NET_ADMIN`, `CAP_NET_ADMIN`, any case).
pub fn capability(name: &str) -> Option<CapabilitySet> {
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    CapabilitySet::from_name(bare)
}

/// Who a container's processes run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Identity {
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) capabilities: CapabilitySet,
    /// Each capability to remove from the bounding set, one bit per entry.
    pub(super) bounding_drops: Vec<CapabilitySet>,
    pub(super) no_new_privs: bool,
}

impl Identity {
    pub(super) fn resolve(
        image: &ImageConfig,
        sc: &SecurityContext,
        container: &str,
    ) -> Result<Self, ContainerError> {
        let spec_error = |what: String| ContainerError::Spec {
            container: container.to_owned(),
            what,
        };
        let (image_uid, image_gid) = match image.user.as_deref() {
            None => (None, None),
            Some(user) => {
                let (u, g) = match user.split_once(':') {
                    Some((u, g)) => (u, Some(g)),
                    None => (user, None),
                };
                let number = |s: &str| {
                    s.parse::<u32>().map_err(|_| {
                        spec_error(format!(
                            "the image's USER {user:?} is not numeric (the image has no /etc/passwd)"
                        ))
                    })
                };
                (Some(number(u)?), g.map(number).transpose()?)
            }
        };
        let uid = sc.run_as_user.or(image_uid).unwrap_or(0);
        let gid = sc.run_as_group.or(image_gid).unwrap_or(0);
        if sc.run_as_non_root && uid == 0 {
            return Err(ContainerError::RunAsNonRoot {
                container: container.to_owned(),
            });
        }
        let all = all_capabilities();
        let parse = |names: &[String]| -> Result<(bool, CapabilitySet), ContainerError> {
            let mut set = CapabilitySet::empty();
            let mut has_all = false;
            for name in names {
                if name.eq_ignore_ascii_case("ALL") {
                    has_all = true;
                } else {
                    set |= capability(name)
                        .ok_or_else(|| spec_error(format!("unknown capability {name:?}")))?;
                }
            }
            Ok((has_all, set))
        };
        let (drop_all, drop) = parse(&sc.drop)?;
        let (add_all, add) = parse(&sc.add)?;
        let capabilities = if sc.privileged || add_all {
            all
        } else if drop_all {
            add & all
        } else {
            ((DEFAULT_CAPABILITIES - drop) | add) & all
        };
        let bounding_drops = kernel_capabilities()
            .difference(capabilities)
            .iter()
            .filter(|c| c.bits().count_ones() == 1)
            .collect();
        Ok(Self {
            uid,
            gid,
            capabilities,
            bounding_drops,
            no_new_privs: !sc.privileged && sc.allow_privilege_escalation == Some(false),
        })
    }
}
