//! GEP-21, the cloud-provider API tunnel, end to end with our binaries in namespaces:
//!
//! ```text
//!  SEEDCTL 10.0.0.2 fd10::2 ── ENDPOINT 10.0.0.1 fd10::1: vpn-server --cloud-api-listen :3128
//!  (curl, HTTPS_PROXY)          │ 10.1.0.1:1194 (OpenVPN), tun0 192.168.123.1 fd00:123::1
//!                               │
//!                          INGRESS 10.1.0.2: vpn-router :8132 (X-Gardener-Destination)
//!                          10.2.1.1 │            │ 10.2.2.1
//!                       VM1 10.2.1.2            VM2 10.2.2.2    vpn-client cloud-api
//!                       10.20.1.2 │             │ 10.20.2.2      (connection files)
//!                                PRIV 10.20.{1,2,3,4}.1 (forwards)
//!                       API 10.20.3.10:443 │    │ OTHER 10.20.4.20:443, :8080
//!                       (openssl s_server,      (counts every accept)
//!                        private CA)
//! ```
//!
//! The VMs reach the endpoint only through the router (no route between their networks and the
//! seed's), and the seed reaches the private network only through the VMs' tunnels.
//! `api.private.example` and `evil.nsx.example` resolve only inside the VMs (a hosts file that
//! `ip netns exec` binds over `/etc/hosts`).
//!
//! Needs the binaries current: `cargo build -p vpn-server -p vpn-client -p vpn-router`.

// A long test here is one scenario read top to bottom; split up, its steps would scatter.
#![allow(clippy::too_many_lines)]

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::gardener::pods::Binaries;
use conformance::netns::Netns;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::wait::wait_until_every;
use pki::{Ca, CertProfile, IssueRequest, KeySpec, San, Validity};

const PROXY: &str = "http://10.0.0.1:3128";
const PROXY6: &str = "http://[fd10::1]:3128";
const ROUTE: &str = "outbound|1194||vpn-seed-server.cloud-api--private-os.svc.cluster.local";
const API_NAME: &str = "api.private.example";
const DEVICE: &str = "cpa-seed-a";
/// What the private API serves; only it can have sent these bytes.
const TOKEN: &str = "private-api-7f3e9c21: keystone says hello";
/// Generous bound for anything to come up.
const UP: Duration = Duration::from_secs(40);
/// How often a wait checks: its checks start curl, ip or a scrape.
const POLL: Duration = Duration::from_millis(100);
const ALLOW: &str = "cloud-api-allow api.private.example:443 *.nsx.example:443 10.20.0.0/22:443";

/// A program started in a namespace, stopped by PID when dropped.
struct Process<'ns> {
    ns: &'ns Netns,
    pid: u32,
    log: PathBuf,
}

impl Process<'_> {
    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn alive(&self) -> bool {
        self.ns.try_wait(self.pid).is_none()
    }
}

impl Drop for Process<'_> {
    fn drop(&mut self) {
        self.ns.stop(self.pid);
    }
}

fn spawn<'ns>(
    ns: &'ns Netns,
    dir: &Path,
    name: &str,
    program: &Path,
    args: &[&str],
) -> Process<'ns> {
    let log = dir.join(format!("{name}.log"));
    let out = fs::File::create(&log).expect("log file");
    let mut cmd = ns.command(&program.display().to_string());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out);
    let pid = ns.spawn(&mut cmd).expect("spawn");
    Process { ns, pid, log }
}

/// `/etc/netns/<ns>/hosts`, which `ip netns exec` binds over `/etc/hosts` for the programs it
/// starts in that namespace; removed on drop.
struct HostsFile(PathBuf);

impl HostsFile {
    fn new(ns: &Netns, lines: &str) -> HostsFile {
        let dir = PathBuf::from("/etc/netns").join(ns.name());
        fs::create_dir_all(&dir).expect("/etc/netns/<ns>");
        fs::write(dir.join("hosts"), lines).expect("hosts");
        HostsFile(dir)
    }
}

impl Drop for HostsFile {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A listener in OTHER that counts every connection it accepts.
fn counting_listener(ns: &Netns, addr: &str) -> Arc<AtomicUsize> {
    let listener = ns
        .run_in(|| TcpListener::bind(addr))
        .expect("run_in")
        .expect("bind");
    let count = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&count);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            c.fetch_add(1, Ordering::SeqCst);
            drop(conn);
        }
    });
    count
}

fn ip(ns: &Netns, args: &[&str]) {
    let mut argv = vec!["ip"];
    argv.extend_from_slice(args);
    ns.run(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
}

/// A veth pair with one address on each end.
fn link(a: &Netns, a_if: &str, a_addr: &[&str], b: &Netns, b_if: &str, b_addr: &[&str]) {
    Netns::veth_pair(a, a_if, b, b_if).expect("veth");
    for (ns, dev, addrs) in [(a, a_if, a_addr), (b, b_if, b_addr)] {
        for addr in addrs {
            let mut args = vec!["addr", "add", *addr, "dev", dev];
            if addr.contains(':') {
                args.push("nodad");
            }
            ip(ns, &args);
        }
    }
}

struct Curl {
    /// The CONNECT's status as curl saw it (0: no answer).
    connect: u16,
    body: String,
}

/// `curl` in `ns` with `HTTPS_PROXY=proxy`, verifying the server against `ca`.
fn curl(ns: &Netns, proxy: &str, ca: &Path, url: &str) -> Curl {
    let out = ns
        .command("curl")
        .args(["-s", "--max-time", "20", "--cacert"])
        .arg(ca)
        .args(["-w", "\n%{http_connect}", url])
        .env_remove("http_proxy")
        .env_remove("all_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("no_proxy")
        .env_remove("NO_PROXY")
        .env("https_proxy", proxy)
        .env("HTTPS_PROXY", proxy)
        .stdin(Stdio::null())
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    Curl {
        connect: code.trim().parse().unwrap_or(0),
        body: body.to_owned(),
    }
}

/// A raw request to the endpoint from `ns`: the status code of the first answer line.
fn raw(ns: &Netns, to: &str, request: &[u8]) -> Option<u16> {
    let to: SocketAddr = to.parse().expect("addr");
    let answer = ns
        .run_in(|| {
            let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            s.write_all(request)?;
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf)?;
            Ok::<_, std::io::Error>(buf[..n].to_vec())
        })
        .expect("run_in");
    let answer = answer.ok()?;
    let text = String::from_utf8_lossy(&answer);
    text.get(9..12)?.parse().ok()
}

/// Whether a TCP connection from `ns` to `to` opens within 2 s.
fn tcp_opens(ns: &Netns, to: SocketAddr) -> bool {
    ns.run_in(|| TcpStream::connect_timeout(&to, Duration::from_secs(2)).is_ok())
        .expect("run_in")
}

/// `GET /metrics` from `ns` at `addr`.
fn scrape(ns: &Netns, addr: &str) -> String {
    let out = ns
        .command("curl")
        .args(["-s", "--noproxy", "*", "--max-time", "5"])
        .arg(format!("http://{addr}/metrics"))
        .output()
        .expect("curl metrics");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of the sample `series` (name and labels as written) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The private CA and the API's certificate for `api.private.example`, as PEM files in `dir`.
fn private_ca(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let now = i64::try_from(netio::clock::unix_now()).expect("time");
    let validity = Validity::days_from(now, 1);
    let ca = Ca::create("private-cloud-ca", KeySpec::EcdsaP256, validity).expect("CA");
    let leaf = ca
        .issue(&IssueRequest {
            profile: CertProfile::Server,
            common_name: API_NAME.to_owned(),
            sans: vec![San::Dns(API_NAME.to_owned())],
            key: KeySpec::EcdsaP256,
            validity,
        })
        .expect("API certificate");
    let ca_pem = dir.join("private-ca.pem");
    let cert = dir.join("api.crt");
    let key = dir.join("api.key");
    fs::write(&ca_pem, ca.cert().to_pem().expect("pem")).expect("write");
    fs::write(&cert, leaf.chain_pem().expect("pem")).expect("write");
    fs::write(&key, pki::pem::private_key_to_pem(leaf.key()).expect("pem")).expect("write");
    (ca_pem, cert, key)
}

/// The connection file of a VM dialling through the router at `router`.
fn connection_file(pki: &TestPki, router: &str, extra: &str) -> String {
    format!(
        "# seed-a: the endpoint of seed a for the private OpenStack\n\
         client\nproto tcp-client\nremote 10.1.0.1 1194\n\
         http-proxy {router} 8132\n\
         http-proxy-option CUSTOM-HEADER X-Gardener-Destination {ROUTE}\n\
         dev tun\nnobind\nconnect-retry 1 2\n\
         ca {}\ncert {}\nkey {}\nremote-cert-tls server\ntls-auth {} 1\n\
         {extra}",
        pki.ca_cert().display(),
        pki.client_cert().display(),
        pki.client_key().display(),
        pki.ta_key().display(),
    )
}

/// Kubernetes' atomic writer: `dir/<name>` links into `..data`, which one rename points at a
/// new version directory holding `files`.
fn k8s_publish(dir: &Path, version: u32, files: &[(&str, &str)]) {
    let v = format!("..v{version}");
    fs::create_dir(dir.join(&v)).expect("version dir");
    for (name, content) in files {
        fs::write(dir.join(&v).join(name), content).expect("write");
        let link = dir.join(name);
        if fs::symlink_metadata(&link).is_err() {
            symlink(format!("..data/{name}"), &link).expect("link");
        }
    }
    symlink(&v, dir.join("..data_tmp")).expect("tmp link");
    fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap");
    // Links to files the new version no longer has go, as the writer removes them.
    for entry in fs::read_dir(dir).expect("dir").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && !files.iter().any(|(f, _)| *f == name) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// The IPv4 address on the tunnel device in `ns`.
fn tunnel_address(ns: &Netns) -> std::net::Ipv4Addr {
    ns.ipv4_on(DEVICE)
        .expect("ip addr")
        .expect("an IPv4 address on the tunnel device")
        .0
}

fn device_exists(ns: &Netns) -> bool {
    ns.run(["ip", "link", "show", DEVICE]).is_ok()
}

#[test]
fn seed_controllers_reach_the_private_api_through_the_vms_and_nothing_else() {
    require_lab(&["curl", "openssl", "nft"]);
    let bins = Binaries::locate()
        .expect("binaries (cargo build -p vpn-server -p vpn-client -p vpn-router)");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let pki = TestPki::generate().expect("pki");
    let (private_ca, api_cert, api_key) = private_ca(d);

    // The namespaces and their links.
    let seedctl = Netns::new().expect("netns");
    let endpoint = Netns::new().expect("netns");
    let ingress = Netns::new().expect("netns");
    let vm1 = Netns::new().expect("netns");
    let vm2 = Netns::new().expect("netns");
    let private = Netns::new().expect("netns");
    let api = Netns::new().expect("netns");
    let other = Netns::new().expect("netns");
    link(
        &seedctl,
        "vpnt-sc",
        &["10.0.0.2/24", "fd10::2/64"],
        &endpoint,
        "vpnt-ep",
        &["10.0.0.1/24", "fd10::1/64"],
    );
    link(
        &endpoint,
        "vpnt-ep-in",
        &["10.1.0.1/24"],
        &ingress,
        "vpnt-in-ep",
        &["10.1.0.2/24"],
    );
    link(
        &ingress,
        "vpnt-in-vm1",
        &["10.2.1.1/24"],
        &vm1,
        "vpnt-vm1-in",
        &["10.2.1.2/24"],
    );
    link(
        &ingress,
        "vpnt-in-vm2",
        &["10.2.2.1/24"],
        &vm2,
        "vpnt-vm2-in",
        &["10.2.2.2/24"],
    );
    link(
        &private,
        "vpnt-pr-vm1",
        &["10.20.1.1/24"],
        &vm1,
        "vpnt-vm1-pr",
        &["10.20.1.2/24"],
    );
    link(
        &private,
        "vpnt-pr-vm2",
        &["10.20.2.1/24"],
        &vm2,
        "vpnt-vm2-pr",
        &["10.20.2.2/24"],
    );
    link(
        &private,
        "vpnt-pr-api",
        &["10.20.3.1/24"],
        &api,
        "vpnt-api",
        &["10.20.3.10/24"],
    );
    link(
        &private,
        "vpnt-pr-oth",
        &["10.20.4.1/24"],
        &other,
        "vpnt-oth",
        &["10.20.4.20/24"],
    );
    private
        .run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        .expect("forwarding");
    for (ns, via) in [
        (&vm1, "10.20.1.1"),
        (&vm2, "10.20.2.1"),
        (&api, "10.20.3.1"),
        (&other, "10.20.4.1"),
    ] {
        ip(ns, &["route", "add", "10.20.0.0/16", "via", via]);
    }
    // The endpoint's pod forwards and the seed routes back through it (so only the firewall
    // keeps the tunnel out of the seed).
    ip(&seedctl, &["route", "add", "default", "via", "10.0.0.1"]);
    ip(
        &seedctl,
        &["-6", "route", "add", "default", "via", "fd10::1"],
    );
    endpoint
        .run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        .expect("forwarding");
    endpoint
        .run(["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])
        .expect("forwarding");
    let hosts =
        format!("127.0.0.1 localhost\n10.20.3.10 {API_NAME}\n10.20.4.20 evil.nsx.example\n");
    let _hosts1 = HostsFile::new(&vm1, &hosts);
    let _hosts2 = HostsFile::new(&vm2, &hosts);

    // The private API, the other private host, a seed-side listener.
    let www = d.join("www");
    fs::create_dir(&www).expect("www");
    fs::write(www.join("hello.txt"), TOKEN).expect("token");
    let api_log = d.join("api.log");
    let mut cmd = api.command("openssl");
    cmd.args([
        "s_server",
        "-quiet",
        "-accept",
        "10.20.3.10:443",
        "-WWW",
        "-cert",
    ])
    .arg(&api_cert)
    .arg("-key")
    .arg(&api_key)
    .current_dir(&www)
    .stdin(Stdio::null())
    .stdout(fs::File::create(&api_log).expect("log"))
    .stderr(Stdio::null());
    let _api = Process {
        pid: api.spawn(&mut cmd).expect("s_server"),
        ns: &api,
        log: api_log,
    };
    let other_443 = counting_listener(&other, "10.20.4.20:443");
    let other_8080 = counting_listener(&other, "10.20.4.20:8080");
    let seed_any = counting_listener(&seedctl, "0.0.0.0:7000");
    let seed_any6 = counting_listener(&seedctl, "[fd10::2]:7001");

    // The router, the endpoint.
    let router_conf = d.join("router.toml");
    fs::write(
        &router_conf,
        format!(
            "[[listener]]\naddress = \"0.0.0.0:8132\"\nheaders = [\"X-Gardener-Destination\"]\n\n\
             [[route]]\nvalue = \"{ROUTE}\"\nupstream = \"10.1.0.1:1194\"\n\
             allow = [\"10.2.0.0/16\"]\n"
        ),
    )
    .expect("router config");
    let _router = spawn(
        &ingress,
        d,
        "router",
        &bins.router,
        &["--config", &router_conf.display().to_string()],
    );
    let server_conf = d.join("server.conf");
    fs::write(
        &server_conf,
        format!(
            "proto tcp-server\nport 1194\ndev tun0\ntopology subnet\n\
             server 192.168.123.0 255.255.255.0\nserver-ipv6 fd00:123::/64\n\
             keepalive 2 10\nduplicate-cn\nca {}\ncert {}\nkey {}\ndh none\ntls-auth {} 0\n",
            pki.ca_cert().display(),
            pki.server_cert().display(),
            pki.server_key().display(),
            pki.ta_key().display()
        ),
    )
    .expect("server config");
    let ep = spawn(
        &endpoint,
        d,
        "endpoint",
        &bins.server,
        &[
            "--config",
            &server_conf.display().to_string(),
            "--log",
            "info",
            "--admin-listen",
            "10.0.0.1:9100",
            "--cloud-api-listen",
            "10.0.0.1:3128,[fd10::1]:3128",
            "--cloud-api-clients",
            "10.0.0.2/32,fd10::2/128",
        ],
    );
    wait_until_every("the endpoint listens", UP, POLL, || {
        tcp_opens(&seedctl, "10.0.0.1:3128".parse().unwrap())
    });

    // VM1 with an empty connection directory: nothing to reach yet.
    let vm1_dir = d.join("vm1");
    fs::create_dir(&vm1_dir).expect("dir");
    let vm_args = |dir: &Path| {
        vec![
            "cloud-api".to_owned(),
            "--connections".to_owned(),
            dir.display().to_string(),
            "--poll-interval-ms".to_owned(),
            "200".to_owned(),
            "--admin-listen".to_owned(),
            "127.0.0.1:9101".to_owned(),
        ]
    };
    let args1 = vm_args(&vm1_dir);
    let args1: Vec<&str> = args1.iter().map(String::as_str).collect();
    let mut vm1_proc = Some(spawn(&vm1, d, "vm1", &bins.client, &args1));
    let url = format!("https://{API_NAME}/hello.txt");
    let first = curl(&seedctl, PROXY, &private_ca, &url);
    assert_eq!(first.connect, 503, "no VM connected yet: {}", ep.log());

    // A connection file appears: the tunnel comes up without a restart.
    let file_a = connection_file(&pki, "10.2.1.1", &format!("{ALLOW}\n"));
    fs::write(vm1_dir.join("seed-a.conf"), &file_a).expect("connection file");
    let took = wait_until_every("the first request through VM1", UP, POLL, || {
        curl(&seedctl, PROXY, &private_ca, &url).connect == 200
    });
    eprintln!("GEP-21: connection file to first answer through the tunnel: {took:?}");

    // End-to-end TLS verified against the private CA; over IPv6 to the endpoint too.
    for proxy in [PROXY, PROXY6] {
        let got = curl(&seedctl, proxy, &private_ca, &url);
        assert_eq!(got.connect, 200, "via {proxy}");
        assert_eq!(got.body, TOKEN, "via {proxy}");
    }
    // Not terminated by us: verified against another CA, the handshake fails.
    let wrong = curl(&seedctl, PROXY, &pki.ca_cert(), &url);
    assert_eq!(wrong.connect, 200);
    assert!(
        wrong.body.is_empty(),
        "certificate of another CA accepted: {}",
        wrong.body
    );

    // Refused with 403, nothing dialed.
    for (what, target) in [
        ("a name outside the list", "https://example.com/"),
        ("an address outside the list", "https://192.0.2.1/"),
        (
            "the VM itself (inside the listed network)",
            "https://10.20.1.2/",
        ),
        ("another private host", "https://10.20.4.20/"),
        (
            "another private host's other port",
            "https://10.20.4.20:8080/",
        ),
        ("a listed address on another port", "https://10.20.3.10:22/"),
        (
            "a listed wildcard resolving outside the list",
            "https://evil.nsx.example/",
        ),
        ("the VM's loopback", "https://127.0.0.1:9101/"),
        ("the VM's tunnel address", "https://192.168.123.2:3128/"),
    ] {
        let got = curl(&seedctl, PROXY, &private_ca, target);
        assert_eq!(got.connect, 403, "{what}: {target}");
    }
    assert_eq!(
        other_443.load(Ordering::SeqCst),
        0,
        "OTHER:443 saw a connection"
    );
    assert_eq!(
        other_8080.load(Ordering::SeqCst),
        0,
        "OTHER:8080 saw a connection"
    );
    let vm1_log = vm1_proc.as_ref().expect("vm1").log();
    for needle in [
        "resolved to 10.20.4.20, outside the allow-list",
        "10.20.1.2 is an address of this VM",
        "name not on the allow-list",
        "status=200",
    ] {
        assert!(
            vm1_log.contains(needle),
            "VM1's log lacks {needle:?}:\n{vm1_log}"
        );
    }
    // Bad requests at the endpoint: 4xx and one log line; a client outside the list: 403.
    assert_eq!(
        raw(
            &seedctl,
            "10.0.0.1:3128",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
        ),
        Some(405)
    );
    assert_eq!(
        raw(&seedctl, "10.0.0.1:3128", b"CONNECT nope HTTP/1.1\r\n\r\n"),
        Some(400)
    );
    assert_eq!(
        curl(&endpoint, PROXY, &private_ca, &url).connect,
        403,
        "the endpoint's own address is no client"
    );
    let ep_log = ep.log();
    assert!(ep_log.contains("is not in --cloud-api-clients"), "{ep_log}");
    assert!(
        ep_log.lines().any(|l| l.contains("CONNECT")
            && l.contains("api.private.example:443")
            && l.contains("status=200")),
        "{ep_log}"
    );

    // From the VM side nothing reaches the seed, IPv4 and IPv6: a VM under an attacker's
    // control routes the seed's networks into its tunnel and tries.
    for net in ["10.0.0.0/24", "10.1.0.0/24", "fd10::/64"] {
        ip(&vm1, &["route", "add", net, "dev", DEVICE]);
    }
    let targets: Vec<SocketAddr> = [
        "192.168.123.1:1194",
        "192.168.123.1:3128",
        "192.168.123.1:9100",
        "[fd00:123::1]:1194",
        "[fd00:123::1]:3128",
        "10.0.0.1:3128",
        "10.0.0.1:9100",
        "10.1.0.1:1194",
        "[fd10::1]:3128",
        "10.0.0.2:7000",
        "[fd10::2]:7001",
    ]
    .iter()
    .map(|a| a.parse().expect("addr"))
    .collect();
    let opened: Vec<(SocketAddr, bool)> = std::thread::scope(|s| {
        let handles: Vec<_> = targets
            .iter()
            .map(|&t| {
                let vm1 = &vm1;
                s.spawn(move || (t, tcp_opens(vm1, t)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("join"))
            .collect()
    });
    for (target, open) in &opened {
        assert!(!open, "the VM opened a connection to {target}");
    }
    assert_eq!(seed_any.load(Ordering::SeqCst), 0);
    assert_eq!(seed_any6.load(Ordering::SeqCst), 0);
    let rules = endpoint
        .run(["nft", "list", "table", "inet", "vpn-seed-server"])
        .expect("nft");
    let rules = String::from_utf8_lossy(&rules.stdout);
    for needle in [
        "hook input",
        "hook forward",
        "iifname \"tun0\" ct state established,related accept",
        "iifname \"tun0\" drop",
    ] {
        assert!(
            rules.contains(needle),
            "the endpoint's rules lack {needle:?}:\n{rules}"
        );
    }
    // Nor does the seed reach the VM's other services through the tunnel: the VM's guard
    // lets in the proxy's port only.
    let vm_ssh = counting_listener(&vm1, "0.0.0.0:2222");
    let vm_tunnel = tunnel_address(&vm1);
    assert!(!tcp_opens(
        &endpoint,
        SocketAddr::new(vm_tunnel.into(), 2222)
    ));
    assert!(tcp_opens(
        &endpoint,
        SocketAddr::new(vm_tunnel.into(), 3128)
    ));
    assert_eq!(
        vm_ssh.load(Ordering::SeqCst),
        0,
        "the seed reached the VM's port 2222"
    );
    let guard = vm1
        .run(["nft", "list", "table", "inet", "vpn-cloud-api"])
        .expect("nft");
    let guard = String::from_utf8_lossy(&guard.stdout);
    for needle in [
        "iifname \"cpa-seed-a\" tcp dport 3128 accept",
        "iifname \"cpa-seed-a\" drop",
        "hook forward",
    ] {
        assert!(
            guard.contains(needle),
            "the VM's rules lack {needle:?}:\n{guard}"
        );
    }
    // The path itself works: the endpoint still reaches the VM through the same tunnel.
    assert_eq!(curl(&seedctl, PROXY, &private_ca, &url).body, TOKEN);

    // A malformed file is reported with its name and line and changes nothing else; a
    // malformed version of the running file leaves the running connection as it was.
    fs::write(
        vm1_dir.join("bad.conf"),
        format!("client\n{ALLOW}\ncloud-api-allow keystone.example\n"),
    )
    .expect("bad");
    let vm1_ref = vm1_proc.as_ref().expect("vm1");
    wait_until_every("the malformed file is reported", UP, POLL, || {
        vm1_ref.log().contains("bad.conf:3: 'cloud-api-allow'")
    });
    fs::write(
        vm1_dir.join("seed-a.conf"),
        format!("{file_a}cloud-api-port 0\n"),
    )
    .expect("bad version");
    let bad_line = format!(
        "seed-a.conf:{}: 'cloud-api-port'",
        file_a.lines().count() + 1
    );
    wait_until_every("the malformed version is reported", UP, POLL, || {
        vm1_ref.log().contains(&bad_line)
    });
    assert!(vm1_ref.alive() && device_exists(&vm1));
    assert_eq!(curl(&seedctl, PROXY, &private_ca, &url).body, TOKEN);
    fs::write(vm1_dir.join("seed-a.conf"), &file_a).expect("restore");
    fs::remove_file(vm1_dir.join("bad.conf")).expect("rm bad");
    let vm1_metrics = scrape(&vm1, "127.0.0.1:9101");
    assert_eq!(
        sample(
            &vm1_metrics,
            "vpn_cloud_api_connection_files_rejected_total"
        ),
        Some(2.0),
        "{vm1_metrics}"
    );
    assert_eq!(sample(&vm1_metrics, "vpn_cloud_api_connections"), Some(1.0));
    assert!(
        sample(
            &vm1_metrics,
            "vpn_cloud_api_denied_total{connection=\"seed-a\",reason=\"resolved\"}"
        ) >= Some(1.0),
        "{vm1_metrics}"
    );
    assert!(
        sample(
            &vm1_metrics,
            "vpn_cloud_api_requests_total{connection=\"seed-a\",code=\"200\"}"
        ) >= Some(3.0),
        "{vm1_metrics}"
    );

    // VM2 joins, its connection file published as a Kubernetes volume does.
    let vm2_dir = d.join("vm2");
    fs::create_dir(&vm2_dir).expect("dir");
    let file_b = connection_file(&pki, "10.2.2.1", &format!("{ALLOW}\n"));
    k8s_publish(&vm2_dir, 1, &[("seed-a.conf", &file_b)]);
    let args2 = vm_args(&vm2_dir);
    let args2: Vec<&str> = args2.iter().map(String::as_str).collect();
    let vm2_proc = spawn(&vm2, d, "vm2", &bins.client, &args2);
    wait_until_every("both VMs connected", UP, POLL, || {
        sample(&scrape(&seedctl, "10.0.0.1:9100"), "vpn_server_clients") == Some(2.0)
    });
    wait_until_every("VM2 carries a request", UP, POLL, || {
        let _ = curl(&seedctl, PROXY, &private_ca, &url);
        vm2_proc.log().contains("status=200")
    });

    // HA: kill -9 one VM while requests keep coming.
    let victim = vm1_proc.take().expect("vm1");
    let killed = Instant::now();
    Command::new("kill")
        .args(["-9", &victim.pid.to_string()])
        .status()
        .expect("kill");
    let mut results: Vec<(Duration, bool)> = Vec::new();
    while results.len() < 100 && killed.elapsed() < Duration::from_secs(30) {
        let got = curl(&seedctl, PROXY, &private_ca, &url);
        let ok = got.body == TOKEN;
        if !ok {
            eprintln!(
                "GEP-21 failover: a request failed {:?} after the kill (CONNECT status {})",
                killed.elapsed(),
                got.connect
            );
        }
        results.push((killed.elapsed(), ok));
        let tail_ok = results.len() >= 10 && results.iter().rev().take(10).all(|(_, ok)| *ok);
        if tail_ok && killed.elapsed() > Duration::from_secs(3) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(victim);
    let failed = results.iter().filter(|(_, ok)| !ok).count();
    let last_failure = results.iter().filter(|(_, ok)| !ok).map(|(t, _)| *t).max();
    let recovered = results
        .iter()
        .find(|(t, ok)| *ok && last_failure.is_none_or(|f| *t > f))
        .map(|(t, _)| *t);
    eprintln!(
        "GEP-21 failover: kill -9 of VM1; {failed} of {} requests failed; every request succeeded from {:?} after the kill (last failure: {last_failure:?})",
        results.len(),
        recovered
    );
    assert!(
        results.iter().rev().take(10).all(|(_, ok)| *ok),
        "requests do not work through VM2: {results:?}"
    );
    assert!(
        recovered.is_some_and(|t| t < Duration::from_secs(15)),
        "{results:?}"
    );

    // Removing VM2's file (a new volume version without it) takes its tunnel down; adding it
    // back brings it up, all without a restart.
    k8s_publish(&vm2_dir, 2, &[]);
    wait_until_every("VM2's tunnel device goes", UP, POLL, || {
        !device_exists(&vm2)
    });
    wait_until_every("the endpoint has no VM", UP, POLL, || {
        curl(&seedctl, PROXY, &private_ca, &url).connect == 503
    });
    k8s_publish(&vm2_dir, 3, &[("seed-a.conf", &file_b)]);
    wait_until_every("VM2 back", UP, POLL, || {
        curl(&seedctl, PROXY, &private_ca, &url).body == TOKEN
    });
    assert!(vm2_proc.alive(), "VM2's process restarted");

    // HA when a VM goes silent instead (its uplink cut: no TCP close, the server lists it
    // until its ping-restart): requests that try it first wait for the TCP bound, then go
    // through the other VM.
    let _vm1_again = spawn(&vm1, d, "vm1-again", &bins.client, &args1);
    wait_until_every("both VMs connected again", UP, POLL, || {
        sample(&scrape(&seedctl, "10.0.0.1:9100"), "vpn_server_clients") == Some(2.0)
    });
    ip(&vm2, &["link", "set", "vpnt-vm2-in", "down"]);
    let cut = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut slow = 0;
    let mut silent: Vec<(Duration, bool)> = Vec::new();
    while silent.len() < 40 && cut.elapsed() < Duration::from_secs(20) {
        let started = Instant::now();
        let ok = curl(&seedctl, PROXY, &private_ca, &url).body == TOKEN;
        slowest = slowest.max(started.elapsed());
        slow += usize::from(started.elapsed() > Duration::from_secs(1));
        silent.push((cut.elapsed(), ok));
        std::thread::sleep(Duration::from_millis(100));
    }
    let failed = silent.iter().filter(|(_, ok)| !ok).count();
    eprintln!(
        "GEP-21 failover: VM2's uplink cut; {failed} of {} requests in {:?} failed; {slow} took over 1 s, the slowest {slowest:?}",
        silent.len(),
        cut.elapsed()
    );
    assert_eq!(failed, 0, "{silent:?}");

    // Audit on the endpoint.
    let m = scrape(&seedctl, "10.0.0.1:9100");
    assert!(
        sample(&m, "vpn_cloud_api_endpoint_requests_total{code=\"200\"}") >= Some(10.0),
        "{m}"
    );
    assert!(
        sample(&m, "vpn_cloud_api_endpoint_requests_total{code=\"403\"}") >= Some(10.0),
        "{m}"
    );
    assert!(
        sample(&m, "vpn_cloud_api_endpoint_requests_total{code=\"503\"}") >= Some(2.0),
        "{m}"
    );
    assert!(
        sample(
            &m,
            "vpn_cloud_api_endpoint_tunnel_bytes_total{direction=\"to_seed\"}"
        ) > Some(1000.0),
        "{m}"
    );
    assert_eq!(
        sample(&m, "vpn_cloud_api_endpoint_clients_denied_total"),
        Some(1.0),
        "{m}"
    );
}
