//! The images `images/build` makes, run through the lab's container runner as Kubernetes
//! would run them: exact file sets and configuration, the binaries starting from the image's
//! root alone, identities and capabilities from Gardener's security contexts, volumes, an
//! emptyDir shared by two containers, exec probes, and `vpn-server setup` switching IPv6 on in
//! a privileged container only.
//!
//! Each test builds the images first if needed (`lab::image::Image::built` runs
//! `bash images/build` once per test binary; a no-op apart from the commit when nothing
//! changed). Needs root, buildah and the lab's tools; fails, never skips, without them.

use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lab::container::{
    all_capabilities, killed_by, ContainerError, ContainerSpec, Pod, ProcStatus, SecurityContext,
    VolumeSource, DEFAULT_CAPABILITIES,
};
use lab::image::{images_dir, Image};
use lab::netns::Netns;
use rustix::process::Signal;
use rustix::thread::CapabilitySet;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const STATUS_PATH: &str = "/srv/status/openvpn.status";
const WAIT: Duration = Duration::from_secs(10);

#[cfg(target_arch = "x86_64")]
const LIBS: (&str, &str) = ("/lib/x86_64-linux-gnu", "/lib64/ld-linux-x86-64.so.2");
#[cfg(target_arch = "aarch64")]
const LIBS: (&str, &str) = ("/lib/aarch64-linux-gnu", "/lib/ld-linux-aarch64.so.1");

fn require() {
    lab::require_lab(&["buildah", "tar", "sysctl", "readelf"]);
}

fn image(name: &str) -> Image {
    Image::built(name).unwrap_or_else(|e| panic!("image {name}: {e}"))
}

/// What each image must hold, nothing more: the binary, the loader, four libraries.
fn expected_files(binary: &str, envoy_link: bool) -> Vec<String> {
    let (libdir, loader) = LIBS;
    let mut dirs: Vec<String> = vec!["/bin".into(), "/lib".into(), libdir.into()];
    let loader_dir = loader.rsplit_once('/').map(|(d, _)| d).unwrap_or("/");
    dirs.push(loader_dir.into());
    if envoy_link {
        dirs.extend(["/usr".into(), "/usr/local".into(), "/usr/local/bin".into()]);
    }
    let mut files: Vec<String> = dirs.iter().map(|d| format!("{d} d 755")).collect();
    files.push(format!("/bin/{binary} f 755"));
    files.push(format!("{loader} f 755"));
    for lib in [
        "libc.so.6",
        "libcrypto.so.3",
        "libgcc_s.so.1",
        "libssl.so.3",
    ] {
        files.push(format!("{libdir}/{lib} f 644"));
    }
    if envoy_link {
        files.push("/usr/local/bin/envoy l -> /bin/vpn-server".into());
    }
    files.sort();
    files.dedup();
    files
}

fn git_head() -> String {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git rev-parse HEAD failed");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn each_image_holds_exactly_its_files_and_configuration() {
    require();
    let head = git_head();
    for (name, binary, envoy_link, entrypoint, path, user) in [
        (
            "vpn-server",
            "vpn-server",
            true,
            "/bin/vpn-server",
            "/usr/local/bin:/bin",
            None,
        ),
        (
            "vpn-client",
            "vpn-client",
            false,
            "/bin/vpn-client",
            "/bin",
            None,
        ),
        (
            "envoy-proxy",
            "vpn-server",
            true,
            "/usr/local/bin/envoy",
            "/usr/local/bin:/bin",
            Some("65532:65532"),
        ),
    ] {
        let img = image(name);
        let rootfs = img.rootfs().expect("rootfs");
        assert_eq!(
            rootfs.files().expect("listing"),
            expected_files(binary, envoy_link),
            "files of {name}"
        );
        let c = img.config();
        assert_eq!(c.entrypoint, vec![entrypoint.to_owned()], "{name}");
        assert!(
            c.cmd.is_empty(),
            "{name}: no CMD, so a command alone replaces everything"
        );
        assert_eq!(c.env, vec![("PATH".to_owned(), path.to_owned())], "{name}");
        assert_eq!(c.user.as_deref(), user, "{name}");
        assert_eq!(
            c.labels.get("org.opencontainers.image.revision"),
            Some(&head),
            "{name}: built from this commit"
        );
        assert_eq!(
            c.labels
                .get("org.opencontainers.image.title")
                .map(String::as_str),
            Some(name)
        );
        assert!(c.labels.contains_key("org.opencontainers.image.source"));
        let reference = std::fs::read_to_string(images_dir().join(format!("{name}.ref")))
            .expect("the build wrote the image's name");
        let tag = reference.trim().rsplit_once(':').map(|(_, t)| t.to_owned());
        assert_eq!(
            c.labels.get("org.opencontainers.image.version"),
            tag.as_ref()
        );
        // The binary is the release build without its debug info.
        let sections = std::process::Command::new("readelf")
            .args(["--section-headers", "--wide"])
            .arg(rootfs.path().join("bin").join(binary))
            .output()
            .expect("readelf runs");
        assert!(sections.status.success());
        let sections = String::from_utf8_lossy(&sections.stdout);
        assert!(sections.contains(".text"), "{name}: {sections}");
        for debug in [".debug_info", ".debug_line"] {
            assert!(!sections.contains(debug), "{name}: {debug} stripped");
        }
    }
    // The envoy-proxy image is the vpn-server image's files under another configuration.
    let server = image("vpn-server").rootfs().expect("rootfs");
    let envoy = image("envoy-proxy").rootfs().expect("rootfs");
    assert_eq!(
        std::fs::read(server.path().join("bin/vpn-server")).expect("server binary"),
        std::fs::read(envoy.path().join("bin/vpn-server")).expect("envoy binary")
    );
}

#[test]
fn the_binaries_run_from_their_images_alone_in_a_lab_namespace() {
    require();
    let ns = Netns::new().expect("netns");
    let pod = Pod::new(&ns, "versions").expect("pod");
    let envoy_sc = SecurityContext {
        drop: vec!["ALL".into()],
        run_as_group: Some(31415),
        run_as_non_root: true,
        allow_privilege_escalation: Some(false),
        ..SecurityContext::default()
    };
    for (image_name, spec, expect_version) in [
        (
            "vpn-server",
            ContainerSpec::new("server").command(["/bin/vpn-server", "--version"]),
            true,
        ),
        (
            "vpn-client",
            ContainerSpec::new("client").command(["/bin/vpn-client", "--version"]),
            true,
        ),
        // A bare name: found through the image's PATH, /usr/local/bin first.
        (
            "vpn-server",
            ContainerSpec::new("envoy-by-path").command(["envoy", "--version"]),
            false,
        ),
        // Gardener's envoy-proxy security context on the envoy-proxy image; args only, so
        // the image's ENTRYPOINT runs.
        (
            "envoy-proxy",
            ContainerSpec::new("envoy-entrypoint")
                .args(["--version"])
                .security(envoy_sc.clone()),
            false,
        ),
    ] {
        let c = pod.start(&image(image_name), &spec).expect("started");
        let status = c.wait(WAIT).expect("exits");
        let out = c.stdout();
        assert!(
            status.success(),
            "{}: {status}; stdout {out:?}, stderr {:?}",
            spec.name,
            c.stderr()
        );
        assert!(!out.trim().is_empty(), "{}: prints a version", spec.name);
        if expect_version {
            assert!(out.contains(VERSION), "{}: {out:?}", spec.name);
        }
    }
}

/// A long-running process from the image: the exporter, on a loopback port of the pod.
fn exporter(name: &str, port: u16) -> ContainerSpec {
    ContainerSpec::new(name)
        .command(["/bin/vpn-server", "exporter", "--listen"])
        .args([format!("127.0.0.1:{port}")])
        .env("OPENVPN_STATUS_PATH", STATUS_PATH)
}

fn running_status(c: &lab::container::Container) -> ProcStatus {
    let status = ProcStatus::read(c.pid()).expect("status");
    assert!(
        c.try_wait().is_none(),
        "{} exited early: {:?}",
        c.name(),
        c.stderr()
    );
    status
}

#[test]
fn a_container_runs_with_the_identity_its_security_context_gives() {
    require();
    let ns = Netns::new().expect("netns");
    let pod = Pod::new(&ns, "identities").expect("pod");

    // Gardener's envoy-proxy container: non-root, group 31415, nothing left.
    let envoy_sc = SecurityContext {
        drop: vec!["ALL".into()],
        run_as_group: Some(31415),
        run_as_non_root: true,
        allow_privilege_escalation: Some(false),
        ..SecurityContext::default()
    };
    let envoy = pod
        .start(
            &image("envoy-proxy"),
            &exporter("envoy", 15000).security(envoy_sc.clone()),
        )
        .expect("envoy");
    let s = running_status(&envoy);
    assert_eq!((s.uid, s.gid), ([65532; 4], [31415; 4]));
    assert!(
        s.groups.is_empty(),
        "supplementary groups cleared: {:?}",
        s.groups
    );
    for (set, what) in [
        (s.effective, "effective"),
        (s.permitted, "permitted"),
        (s.inheritable, "inheritable"),
        (s.ambient, "ambient"),
        (s.bounding, "bounding"),
    ] {
        assert!(set.is_empty(), "{what}: {set:?}");
    }
    assert!(s.no_new_privs);

    // The same security context on the vpn-server image (no USER): refused as the kubelet
    // refuses it.
    let refused = pod.start(
        &image("vpn-server"),
        &exporter("refused", 15001).security(envoy_sc),
    );
    assert!(
        matches!(refused, Err(ContainerError::RunAsNonRoot { .. })),
        "{refused:?}"
    );

    // Gardener's vpn-seed-server container: root, the defaults plus NET_ADMIN (NET_RAW is one).
    let server_sc = SecurityContext {
        add: vec!["NET_ADMIN".into(), "NET_RAW".into()],
        allow_privilege_escalation: Some(false),
        ..SecurityContext::default()
    };
    let server = pod
        .start(
            &image("vpn-server"),
            &exporter("server", 15002).security(server_sc),
        )
        .expect("server");
    let s = running_status(&server);
    let want = DEFAULT_CAPABILITIES | CapabilitySet::NET_ADMIN;
    assert_eq!((s.uid, s.gid), ([0; 4], [0; 4]));
    assert_eq!(s.effective, want, "missing {:?}", want - s.effective);
    assert_eq!(s.permitted, want);
    assert_eq!(s.bounding, want);
    assert!(s.inheritable.is_empty() && s.ambient.is_empty());
    assert!(s.no_new_privs);

    // An exec probe's process: the same identity, mount and network namespace.
    let probe = server
        .exec_spawn(&["/bin/vpn-server", "exporter", "--listen", "127.0.0.1:15003"])
        .expect("exec");
    let p = ProcStatus::read(probe.pid()).expect("exec status");
    assert_eq!(p, s, "an exec'd process has the container's identity");
    for ns_kind in ["mnt", "net", "uts"] {
        let link = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/{ns_kind}")).expect("ns");
        assert_eq!(link(probe.pid()), link(server.pid()), "{ns_kind} namespace");
    }
    let lab_net = std::fs::metadata(format!("/run/netns/{}", ns.name())).expect("netns file");
    let server_net = std::fs::metadata(format!("/proc/{}/ns/net", server.pid())).expect("ns");
    assert_eq!(
        lab_net.ino(),
        server_net.ino(),
        "the pod's network namespace"
    );
    assert_ne!(
        std::fs::read_link("/proc/self/ns/mnt").expect("own mnt"),
        std::fs::read_link(format!("/proc/{}/ns/mnt", server.pid())).expect("container mnt"),
        "its own mount namespace"
    );
    drop(probe);

    // A privileged container has every capability.
    let privileged = pod
        .start(
            &image("vpn-server"),
            &exporter("privileged", 15004).security(SecurityContext::privileged()),
        )
        .expect("privileged");
    let s = running_status(&privileged);
    assert_eq!(s.effective, all_capabilities());
    assert!(!s.no_new_privs);
}

#[test]
fn volumes_have_their_modes_and_file_volumes_are_read_only() {
    require();
    let ns = Netns::new().expect("netns");
    let pod = Pod::new(&ns, "vpn-seed-server-0").expect("pod");
    let certs = vec![
        ("ca.crt".to_owned(), b"CA\n".to_vec()),
        ("tls.crt".to_owned(), b"CRT\n".to_vec()),
        ("tls.key".to_owned(), b"KEY\n".to_vec()),
    ];
    pod.add_volume(
        "certs",
        VolumeSource::Files {
            files: certs,
            mode: 0o644,
        },
    )
    .expect("certs");
    pod.add_volume(
        "tlsauth",
        VolumeSource::Files {
            files: vec![("vpn.tlsauth".to_owned(), b"KEY\n".to_vec())],
            mode: 0o400,
        },
    )
    .expect("tlsauth");
    let status_dir = pod
        .add_volume("openvpn-status", VolumeSource::EmptyDir)
        .expect("emptyDir");
    pod.add_volume("dev-net-tun", VolumeSource::HostPath("/dev/net/tun".into()))
        .expect("hostPath");
    let spec = exporter("vpn-seed-server", 15000)
        .mount("dev-net-tun", "/dev/net/tun")
        .mount("certs", "/srv/secrets/vpn-server")
        .mount("tlsauth", "/srv/secrets/tlsauth")
        .mount("openvpn-status", "/srv/status");
    let c = pod.start(&image("vpn-server"), &spec).expect("started");
    running_status(&c);

    let tlsauth = c.path("/srv/secrets/tlsauth/vpn.tlsauth");
    let meta = std::fs::metadata(&tlsauth).expect("tlsauth");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o400);
    assert_eq!((meta.uid(), meta.gid()), (0, 0));
    assert_eq!(std::fs::read(&tlsauth).expect("read"), b"KEY\n");
    assert_eq!(
        std::fs::read_link(&tlsauth).expect("a link, as the kubelet writes"),
        std::path::Path::new("..data/vpn.tlsauth")
    );
    let key = std::fs::metadata(c.path("/srv/secrets/vpn-server/tls.key")).expect("key");
    assert_eq!(key.permissions().mode() & 0o7777, 0o644);

    for dir in ["/srv/secrets/tlsauth", "/srv/secrets/vpn-server"] {
        let err = std::fs::write(c.path(dir).join("new"), b"x").expect_err("read-only");
        assert_eq!(err.raw_os_error(), Some(30), "{dir}: EROFS, got {err}");
    }
    // The emptyDir is writable and is the pod's directory.
    std::fs::write(c.path("/srv/status/probe"), b"x").expect("emptyDir writable");
    assert_eq!(
        std::fs::read(status_dir.join("probe")).expect("host side"),
        b"x"
    );

    let tun = std::fs::metadata(c.path("/dev/net/tun")).expect("tun");
    let host_tun = std::fs::metadata("/dev/net/tun").expect("host tun");
    assert!(tun.file_type().is_char_device());
    assert_eq!(tun.rdev(), host_tun.rdev());

    // Not privileged: /proc/sys is read-only, as in a cluster.
    let err = std::fs::write(c.path("/proc/sys/net/ipv4/ip_forward"), b"1")
        .expect_err("read-only /proc/sys");
    assert_eq!(err.raw_os_error(), Some(30), "EROFS, got {err}");
    // Nothing of the image but what it holds, plus the mount points.
    let root = std::fs::read_dir(c.path("/")).expect("root");
    let mut names: Vec<String> = root
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["bin", "dev", "lib", "lib64", "proc", "srv", "sys", "usr"]
    );
}

/// A status file as OpenVPN 2.6 writes it, with `TIME` now, in UTC, and no client.
fn status_file_now() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let (days, secs) = (now / 86_400, now % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "TITLE,OpenVPN 2.6.14 x86_64-pc-linux-gnu [SSL (OpenSSL)] [LZO] [LZ4] [EPOLL] [MH/PKTINFO] [AEAD]\n\
         TIME,{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02},{now}\n\
         HEADER,CLIENT_LIST,Common Name,Real Address,Virtual Address,Virtual IPv6 Address,Bytes Received,Bytes Sent,Connected Since,Connected Since (time_t),Username,Client ID,Peer ID,Data Channel Cipher\n\
         HEADER,ROUTING_TABLE,Virtual Address,Common Name,Real Address,Last Ref,Last Ref (time_t)\n\
         GLOBAL_STATS,Max bcast/mcast queue length,0\n\
         END\n",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[test]
fn an_empty_dir_is_shared_by_two_containers_of_a_pod_and_exec_probes_read_it() {
    require();
    let ns = Netns::new().expect("netns");
    let pod = Pod::new(&ns, "shared").expect("pod");
    pod.add_volume("openvpn-status", VolumeSource::EmptyDir)
        .expect("emptyDir");
    let server = image("vpn-server");
    let writer = pod
        .start(
            &server,
            &exporter("writer", 15000).mount("openvpn-status", "/srv/status"),
        )
        .expect("writer");
    let reader = pod
        .start(
            &server,
            &exporter("reader", 15001).mount("openvpn-status", "/srv/status"),
        )
        .expect("reader");
    let loner = pod
        .start(&server, &exporter("without-the-volume", 15002))
        .expect("loner");
    running_status(&writer);
    running_status(&reader);
    running_status(&loner);

    // Written through one container's view, probed from inside the other.
    std::fs::write(writer.path(STATUS_PATH), status_file_now()).expect("write");
    for verb in ["liveness", "readiness"] {
        let out = reader
            .exec(&["/bin/vpn-server", verb], Duration::from_secs(5))
            .expect("exec");
        assert!(out.success(), "{verb}: {out:?}");
        let out = loner
            .exec(&["/bin/vpn-server", verb], Duration::from_secs(5))
            .expect("exec");
        assert!(!out.success(), "{verb} without the volume: {out:?}");
        assert!(out.stdout.contains("status file"), "{verb}: {out:?}");
    }
    let a = std::fs::metadata(writer.path(STATUS_PATH)).expect("writer view");
    let b = std::fs::metadata(reader.path(STATUS_PATH)).expect("reader view");
    assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()));

    // An exec that outlives its timeout is killed (a probe's timeoutSeconds).
    let out = reader
        .exec(
            &["/bin/vpn-server", "exporter", "--listen", "127.0.0.1:15003"],
            Duration::from_millis(300),
        )
        .expect("exec");
    assert!(out.status.is_none(), "{out:?}");
}

fn disable_ipv6(ns: &Netns) -> String {
    let out = ns
        .run(["sysctl", "-n", "net.ipv6.conf.all.disable_ipv6"])
        .expect("sysctl");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn setup_turns_ipv6_on_in_a_privileged_container_only() {
    require();
    let root_ns_before = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6")
        .expect("root namespace value");
    let ns = Netns::new().expect("netns");
    ns.run(["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"])
        .expect("sysctl -w in the lab namespace");
    assert_eq!(disable_ipv6(&ns), "1");
    let pod = Pod::new(&ns, "vpn-seed-server").expect("pod");
    let server = image("vpn-server");

    // With NET_ADMIN but not privileged, /proc/sys is read-only: setup fails, as it would.
    let unprivileged = SecurityContext {
        add: vec!["NET_ADMIN".into(), "NET_RAW".into()],
        ..SecurityContext::default()
    };
    let c = pod
        .start(
            &server,
            &ContainerSpec::new("setup-unprivileged")
                .command(["/bin/vpn-server", "setup"])
                .security(unprivileged),
        )
        .expect("started");
    let status = c.wait(WAIT).expect("exits");
    assert!(
        !status.success(),
        "stdout {:?} stderr {:?}",
        c.stdout(),
        c.stderr()
    );
    assert_eq!(disable_ipv6(&ns), "1");

    // Gardener's init container `setup`: privileged.
    let c = pod
        .start(
            &server,
            &ContainerSpec::new("setup")
                .command(["/bin/vpn-server", "setup"])
                .security(SecurityContext::privileged()),
        )
        .expect("started");
    let status = c.wait(WAIT).expect("exits");
    assert!(
        status.success(),
        "stdout {:?} stderr {:?}",
        c.stdout(),
        c.stderr()
    );
    assert_eq!(disable_ipv6(&ns), "0");
    assert_eq!(
        std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6").expect("root"),
        root_ns_before,
        "the root namespace is untouched"
    );
}

#[test]
fn containers_stop_on_signals_and_leave_nothing_behind() {
    require();
    let ns = Netns::new().expect("netns");
    let pod = Pod::new(&ns, "signals").expect("pod");
    let server = image("vpn-server");

    let c = pod
        .start(&server, &exporter("term", 15000))
        .expect("started");
    running_status(&c);
    c.terminate();
    let status = c.wait(WAIT).expect("SIGTERM ends the exporter");
    assert!(
        status.success() || killed_by(status, Signal::TERM),
        "{status}"
    );

    let c = pod
        .start(&server, &exporter("kill", 15001))
        .expect("started");
    running_status(&c);
    c.kill();
    assert!(killed_by(c.wait(WAIT).expect("exits"), Signal::KILL));

    let c = pod
        .start(&server, &exporter("dropped", 15002))
        .expect("started");
    running_status(&c);
    let (pid, rootfs) = (c.pid(), c.rootfs().to_path_buf());
    assert!(rootfs.join("bin/vpn-server").exists());
    // A process still running in the container when it drops is killed with it (held here
    // unreaped, so its PID stays ours to look at).
    let straggler = c
        .exec_spawn(&["/bin/vpn-server", "exporter", "--listen", "127.0.0.1:15003"])
        .expect("exec");
    drop(c);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "reaped"
    );
    assert!(!rootfs.exists(), "root filesystem copy removed");
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", straggler.pid())).expect("stat");
    let state = stat.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
    assert_eq!(state, Some("Z"), "the exec'd process was killed: {stat}");
}

#[test]
fn bad_specs_and_failed_starts_say_what_went_wrong() {
    require();
    let ns = Netns::new().expect("netns");
    let pod = Pod::new(&ns, "errors").expect("pod");
    let server = image("vpn-server");
    pod.add_volume("scratch", VolumeSource::EmptyDir)
        .expect("emptyDir");

    // A mount path through the image's symbolic link could lead out of the root.
    let spec = ContainerSpec::new("through-link")
        .command(["/bin/vpn-server", "--version"])
        .mount("scratch", "/usr/local/bin/envoy/x");
    let err = pod.start(&server, &spec).expect_err("refused");
    assert!(err.to_string().contains("symbolic link"), "{err}");

    let spec = ContainerSpec::new("no-volume")
        .command(["/bin/vpn-server", "--version"])
        .mount("absent", "/srv/x");
    let err = pod.start(&server, &spec).expect_err("refused");
    assert!(err.to_string().contains("no volume named absent"), "{err}");

    // The image has no shell: a command it does not hold fails at exec.
    let spec = ContainerSpec::new("no-shell").command(["/bin/sh", "-c", "true"]);
    match pod.start(&server, &spec) {
        Err(ContainerError::Start { source, .. }) => {
            assert_eq!(source.kind(), ErrorKind::NotFound, "{source}")
        }
        other => panic!("expected a start error, got {other:?}"),
    }
}
