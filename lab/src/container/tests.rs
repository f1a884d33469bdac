use super::*;

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

fn image(entrypoint: &[&str], cmd: &[&str], user: Option<&str>) -> ImageConfig {
    ImageConfig {
        entrypoint: strings(entrypoint),
        cmd: strings(cmd),
        env: vec![("PATH".to_owned(), "/usr/local/bin:/bin".to_owned())],
        user: user.map(str::to_owned),
        ..ImageConfig::default()
    }
}

#[test]
fn command_and_args_combine_with_the_image_as_kubernetes_does() {
    let img = image(&["/bin/vpn-server"], &["--default"], None);
    // Neither: ENTRYPOINT + CMD (vpn-seed-server, vpn-shoot).
    assert_eq!(
        container_argv(&img, &[], &[]),
        strings(&["/bin/vpn-server", "--default"])
    );
    // command alone: ENTRYPOINT and CMD both ignored (setup, envoy).
    assert_eq!(
        container_argv(&img, &strings(&["/bin/vpn-server", "setup"]), &[]),
        strings(&["/bin/vpn-server", "setup"])
    );
    // args alone: ENTRYPOINT + args.
    assert_eq!(
        container_argv(&img, &[], &strings(&["exporter"])),
        strings(&["/bin/vpn-server", "exporter"])
    );
    assert_eq!(
        container_argv(&img, &strings(&["envoy"]), &strings(&["-c", "x"])),
        strings(&["envoy", "-c", "x"])
    );
    assert!(container_argv(&image(&[], &[], None), &[], &[]).is_empty());
}

#[test]
fn the_spec_env_overrides_the_image_env_in_place() {
    let img = image(&[], &[], None);
    let env = container_env(
        &img,
        &[
            ("A".to_owned(), "1".to_owned()),
            ("PATH".to_owned(), "/bin".to_owned()),
            ("A".to_owned(), "2".to_owned()),
        ],
    );
    assert_eq!(
        env,
        vec![
            ("PATH".to_owned(), "/bin".to_owned()),
            ("A".to_owned(), "2".to_owned())
        ]
    );
}

#[test]
fn capabilities_follow_containerd() {
    let img = image(&[], &[], None);
    let root_net_admin = SecurityContext {
        add: strings(&["NET_ADMIN", "cap_net_raw"]),
        allow_privilege_escalation: Some(false),
        ..SecurityContext::default()
    };
    let id = Identity::resolve(&img, &root_net_admin, "c").expect("valid");
    assert_eq!(
        id.capabilities,
        DEFAULT_CAPABILITIES | CapabilitySet::NET_ADMIN
    );
    assert_eq!((id.uid, id.gid, id.no_new_privs), (0, 0, true));
    assert_eq!(DEFAULT_CAPABILITIES.bits().count_ones(), 14);

    let envoy = SecurityContext {
        drop: strings(&["all"]),
        run_as_group: Some(31415),
        run_as_non_root: true,
        allow_privilege_escalation: Some(false),
        ..SecurityContext::default()
    };
    let id =
        Identity::resolve(&image(&[], &[], Some("65532:65532")), &envoy, "envoy").expect("valid");
    assert_eq!((id.uid, id.gid), (65532, 31415));
    assert!(id.capabilities.is_empty());
    assert_eq!(
        id.bounding_drops.len() as u32,
        kernel_capabilities().bits().count_ones()
    );
    // The same spec on an image without USER is refused, as the kubelet refuses it.
    assert!(matches!(
        Identity::resolve(&img, &envoy, "envoy"),
        Err(ContainerError::RunAsNonRoot { .. })
    ));

    let drop_one = SecurityContext {
        drop: strings(&["NET_RAW"]),
        ..SecurityContext::default()
    };
    let id = Identity::resolve(&img, &drop_one, "c").expect("valid");
    assert_eq!(
        id.capabilities,
        DEFAULT_CAPABILITIES - CapabilitySet::NET_RAW
    );

    let id = Identity::resolve(&img, &SecurityContext::privileged(), "c").expect("valid");
    assert_eq!(id.capabilities, all_capabilities());
    assert_eq!(
        id.bounding_drops.len() as u32,
        (kernel_capabilities() - all_capabilities())
            .bits()
            .count_ones()
    );

    let unknown = SecurityContext {
        add: strings(&["NET_WIZARD"]),
        ..SecurityContext::default()
    };
    assert!(Identity::resolve(&img, &unknown, "c").is_err());
    let named = image(&[], &[], Some("nonroot"));
    assert!(Identity::resolve(&named, &SecurityContext::default(), "c").is_err());
}

#[test]
fn mount_paths_are_plain_relative_paths() {
    assert_eq!(
        relative_path("/srv/secrets/tlsauth"),
        Some(PathBuf::from("srv/secrets/tlsauth"))
    );
    assert_eq!(relative_path("/"), None);
    assert_eq!(relative_path("/srv/../etc"), None);
}

#[test]
fn file_volumes_are_laid_out_as_the_kubelet_does() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("v");
    let files = vec![
        ("ca.crt".to_owned(), b"ca".to_vec()),
        ("sub/x".to_owned(), b"x".to_vec()),
    ];
    write_atomic_layout(&dir, &files, 0o400).expect("written");
    let data = std::fs::read_link(dir.join("..data")).expect("..data");
    assert!(data.to_string_lossy().starts_with(".."));
    assert_eq!(
        std::fs::read_link(dir.join("ca.crt")).expect("link"),
        Path::new("..data/ca.crt")
    );
    let meta = std::fs::metadata(dir.join("ca.crt")).expect("target");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o400);
    assert_eq!(std::fs::read(dir.join("sub/x")).expect("nested"), b"x");
}
