//! How each [`Scenario`] is driven, and what it asserts.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::config::{self, Transport};
use super::lab::{Lab, PROXY_ADDR, PROXY_PORT, SERVER_TUN};
use super::logs;
use super::peer::{Impl, Peer, Side};
use super::proxy::Proxy;
use super::traffic::{ping, transfer, tun_address};
use super::{Case, Env, Outcome, Scenario};

/// How long a tunnel may take to come up (also after a reconnect).
const UP_TIMEOUT: Duration = Duration::from_secs(45);
/// How long a server may take to listen.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(15);
/// How long one ping check may take.
const PING_TIMEOUT: Duration = Duration::from_secs(10);
/// Lines of each log shown with a failure.
const TAIL_LINES: usize = 25;
/// Size of the plain transfer.
const TRANSFER_LEN: usize = 1 << 20;
/// The renegotiation scenario: interval, duration, and the minimum renegotiations each side
/// must see in that time (60 s / 5 s = 12, less slack for start-up and jitter).
const RENEG_SEC: u32 = 5;
const RENEG_RUN: Duration = Duration::from_secs(60);
const RENEG_MIN: usize = 8;
/// The slow transfer that runs across the renegotiations: 16 KiB every 50 ms for 60 s.
const SLOW_CHUNK: usize = 16 * 1024;
const SLOW_PAUSE: Duration = Duration::from_millis(50);

/// The pushed options of [`Scenario::Push`] (server `push` lines).
pub const PUSHES: &[&str] = &[
    r#"push "route 10.250.0.0 255.255.0.0""#,
    r#"push "route 10.250.1.0    255.255.255.0""#,
    r#"push "route 10.252.0.0 \"255.255.0.0\"""#,
    r#"push "route 10.99.0.0 255.255.0.0""#,
    r#"push "route  10.250.2.0 255.255.255.0""#,
    r#"push "redirect-gateway def1""#,
    r#"push "route 10.253.0.0 255.255.0.0 net_gateway""#,
    // Network bits outside the mask, through the filters' text prefixes: upstream's kernel
    // refuses each route, our push guard refuses the option (masked, the first would be
    // 10.0.0.0/8).
    r#"push "route 10.252.9.9 255.0.0.0""#,
    r#"push "route 10.250.3.1  \"255.255.255.0\"""#,
    r#"push "route 10.250.7.1 255.255.255.0 vpn_gateway""#,
    // Option names are case-sensitive: unknown options, applied by neither client.
    r#"push "ROUTE 10.250.5.0 255.255.255.0""#,
    r#"push "Route 10.250.6.0 255.255.255.0""#,
];

/// The client's pull-filters of [`Scenario::Push`] (the first only without `redirect`).
pub const PULL_FILTERS: &[&str] = &[
    r#"pull-filter ignore "redirect-gateway""#,
    r#"pull-filter accept "route 10.250.""#,
    r#"pull-filter accept "route 10.252.""#,
    r#"pull-filter ignore "route ""#,
];

/// Routes a client must install from [`PUSHES`] under [`PULL_FILTERS`], and must not.
const PUSH_WANTED: &[&str] = &["10.250.0.0/16", "10.250.1.0/24", "10.252.0.0/16"];
const PUSH_UNWANTED: &[&str] = &[
    "10.99.0.0/16",
    "10.250.2.0/24",
    "10.0.0.0/8",
    "10.250.3.0/24",
    "10.250.7.0/24",
    "10.250.5.0/24",
    "10.250.6.0/24",
];

/// [`Scenario::PushOverPath`]: a route that contains the server's transport address
/// (10.200.2.2), and one that does not.
pub const PUSHES_OVER_PATH: &[&str] = &[
    r#"push "route 10.200.2.0 255.255.255.0""#,
    r#"push "route 10.250.0.0 255.255.0.0""#,
];
/// What `redirect-gateway def1` and the `net_gateway` route install (upstream only, and only
/// with `redirect`).
const REDIRECT_ROUTES: &[&str] = &["0.0.0.0/1", "128.0.0.0/1", "10.253.0.0/16"];
/// The filter that lets the `net_gateway` route through with `redirect`.
const NET_GATEWAY_FILTER: &str = r#"pull-filter accept "route 10.253.""#;

pub(super) fn run(env: &Env<'_>, case: &Case) -> Outcome {
    let mut outcome = Outcome {
        result: Err(String::new()),
        tails: None,
        routes: Vec::new(),
        push_reply: None,
        elapsed: Duration::ZERO,
    };
    let dir = match tempfile::Builder::new().prefix("vpnt-matrix-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            outcome.result = Err(format!("tempdir: {e}"));
            return outcome;
        }
    };
    let lab = match Lab::new() {
        Ok(l) => l,
        Err(e) => {
            outcome.result = Err(format!("lab: {e}"));
            return outcome;
        }
    };
    let (server_extra, client_extra) = extras(case);
    let proxy = match case.options.transport {
        Transport::Direct => None,
        Transport::Tinyproxy => {
            let started = crate::tinyproxy::start(
                &lab.ingress,
                dir.path(),
                PROXY_ADDR,
                PROXY_PORT,
                "10.200.1.0/24",
                super::lab::SERVER_PORT,
            );
            if let Err(e) = started {
                outcome.result = Err(format!("tinyproxy: {e}"));
                return outcome;
            }
            None
        }
        Transport::Proxy => {
            match Proxy::start(&lab.ingress, SocketAddr::from((PROXY_ADDR, PROXY_PORT))) {
                Ok(p) => Some(p),
                Err(e) => {
                    outcome.result = Err(format!("proxy: {e}"));
                    return outcome;
                }
            }
        }
    };
    let server_conf = config::server(env.pki, &case.options, &server_extra);
    let client_conf = config::client(env.pki, &case.options, &client_extra);
    let server = match Peer::start(
        &lab.seed,
        (case.pair.server, Side::Server),
        env.ours_bin,
        dir.path(),
        &server_conf,
        case.options.ekm,
    ) {
        Ok(p) => p,
        Err(e) => {
            outcome.result = Err(format!("start server: {e}"));
            return outcome;
        }
    };
    let mut run = Run {
        lab: &lab,
        server,
        client: None,
        proxy,
        v6: case.options.ipv6_only,
    };
    let result = run.drive(case, env, dir.path(), &client_conf, &mut outcome.routes);
    if case.pair.client == Impl::Upstream {
        outcome.push_reply = logs::received_push_reply(&run.client_log());
    }
    if result.is_err() || env.verbose {
        outcome.tails = Some((
            run.server.tail(TAIL_LINES),
            run.client
                .as_ref()
                .map(|c| c.tail(TAIL_LINES))
                .unwrap_or_default(),
        ));
    }
    outcome.result = result;
    outcome
}

/// Scenario-specific config lines: (server, client).
fn extras(case: &Case) -> (Vec<String>, Vec<String>) {
    let s = |v: &[&str]| v.iter().map(|l| (*l).to_owned()).collect::<Vec<_>>();
    match case.scenario {
        Scenario::Traffic { .. } | Scenario::NoCommonCipher | Scenario::ServerRestart => {
            (s(&["keepalive 10 60"]), vec![])
        }
        Scenario::Renegotiate { initiator } => {
            let on = format!("reneg-sec {RENEG_SEC}");
            let off = "reneg-sec 0".to_owned();
            let (srv, cli) = match initiator {
                Side::Server => (on, off),
                Side::Client => (off, on),
            };
            (vec!["keepalive 10 60".into(), srv], vec![cli])
        }
        Scenario::KeepaliveExpiry => (s(&["keepalive 2 6"]), vec![]),
        Scenario::PushOverPath => {
            let mut srv = s(&["keepalive 10 60"]);
            srv.extend(s(PUSHES_OVER_PATH));
            (srv, vec![])
        }
        Scenario::Push { redirect } => {
            let mut srv = s(&["keepalive 10 60"]);
            srv.extend(s(PUSHES));
            let filters = if redirect {
                // Also let the route outside the tunnel through.
                let mut f = vec![NET_GATEWAY_FILTER.to_owned()];
                f.extend(s(&PULL_FILTERS[1..]));
                f
            } else {
                s(PULL_FILTERS)
            };
            (srv, filters)
        }
    }
}

struct Run<'l> {
    lab: &'l Lab,
    server: Peer<'l>,
    client: Option<Peer<'l>>,
    proxy: Option<Proxy>,
    /// The tunnel carries IPv6 only (vpn2's transfer network).
    v6: bool,
}

impl<'l> Run<'l> {
    /// Starts the client, waits for the session and checks what both sides negotiated, then
    /// drives the case's scenario; the one-line summary of what held.
    fn drive(
        &mut self,
        case: &Case,
        env: &Env<'_>,
        dir: &std::path::Path,
        client_conf: &str,
        routes: &mut Vec<String>,
    ) -> Result<String, String> {
        let (s_imp, c_imp) = self.start_client(case, env, dir, client_conf)?;
        if case.scenario == Scenario::NoCommonCipher {
            return self.no_common_cipher();
        }
        let mut summary = self.check_negotiated(case, s_imp, c_imp)?;
        if case.scenario == Scenario::PushOverPath {
            return self.push_over_path(c_imp, routes, summary);
        }
        let client_tun = self.ping_both()?;
        self.check_proxy_saw_header(&mut summary)?;
        match case.scenario {
            Scenario::Traffic { .. } => {
                transfer(
                    &self.lab.seed,
                    &self.lab.shoot,
                    client_tun,
                    TRANSFER_LEN,
                    64 * 1024,
                    Duration::ZERO,
                )?;
                summary.push_str(", ping + 1 MiB sha256 ok");
            }
            Scenario::Renegotiate { initiator } => {
                self.renegotiate_under_traffic(
                    initiator,
                    client_tun,
                    (s_imp, c_imp),
                    &mut summary,
                )?;
            }
            Scenario::KeepaliveExpiry => {
                self.lab.blackhole(true).map_err(|e| e.to_string())?;
                let cut = self.keepalive_expiry(c_imp, s_imp);
                self.lab.blackhole(false).map_err(|e| e.to_string())?;
                cut?;
                self.reconnected_with_traffic()?;
                summary
                    .push_str(", both sides expired the silent session, reconnected, traffic ok");
            }
            Scenario::ServerRestart => {
                self.server.stop();
                self.server.restart().map_err(|e| e.to_string())?;
                self.reconnected_with_traffic()?;
                summary.push_str(", server restarted, client reconnected, traffic ok");
            }
            Scenario::Push { redirect } => {
                *routes = self.routes()?;
                check_pushed_routes(routes, redirect, c_imp, &mut summary)?;
            }
            Scenario::NoCommonCipher | Scenario::PushOverPath => {}
        }
        Ok(summary)
    }

    /// Waits until the server listens and starts the client; the implementations of both
    /// sides.
    fn start_client(
        &mut self,
        case: &Case,
        env: &Env<'_>,
        dir: &std::path::Path,
        client_conf: &str,
    ) -> Result<(Impl, Impl), String> {
        let s_imp = self.server.imp();
        self.server.wait_log("listening", LISTEN_TIMEOUT, |l| {
            l.contains(logs::up_marker(s_imp, Side::Server))
        })?;
        let client = Peer::start(
            &self.lab.shoot,
            (case.pair.client, Side::Client),
            env.ours_bin,
            dir,
            client_conf,
            case.options.ekm,
        )
        .map_err(|e| format!("start client: {e}"))?;
        let client = self.client.insert(client);
        Ok((s_imp, client.imp()))
    }

    /// Waits for the first session and checks that both sides logged the same cipher (the
    /// case's, for [`Scenario::Traffic`]) and the key derivation the pair must agree on; the
    /// summary's start.
    fn check_negotiated(&self, case: &Case, s_imp: Impl, c_imp: Impl) -> Result<String, String> {
        let client = self.client.as_ref().ok_or("no client")?;
        self.wait_sessions(1)?;
        let s_log = self.server.log();
        let c_log = client.log();
        let s_cipher = logs::cipher(s_imp, &s_log).unwrap_or_else(|| "?".into());
        let c_cipher = logs::cipher(c_imp, &c_log).unwrap_or_else(|| "?".into());
        let s_kdf = logs::key_derivation(s_imp, Side::Server, &s_log).unwrap_or("?");
        let c_kdf = logs::key_derivation(c_imp, Side::Client, &c_log).unwrap_or("?");
        let summary = format!("cipher {s_cipher}/{c_cipher}, keys {s_kdf}/{c_kdf}");
        if s_cipher != c_cipher {
            return Err(format!("ciphers differ: {summary}"));
        }
        if s_kdf != c_kdf || s_kdf == "?" {
            return Err(format!("key derivation differs or unknown: {summary}"));
        }
        if let Scenario::Traffic { expect } = case.scenario {
            if s_cipher != expect {
                return Err(format!("expected cipher {expect}: {summary}"));
            }
        }
        // Upstream 2.6 always offers the exporter: PRF only when one of ours does not.
        let want_kdf = if case.options.ekm || case.pair.is_control() {
            "ekm"
        } else {
            "prf"
        };
        if s_kdf != want_kdf {
            return Err(format!("expected key derivation {want_kdf}: {summary}"));
        }
        Ok(summary)
    }

    /// Through a proxy: checks that the proxy saw the routing header and adds its request
    /// line to the summary.
    fn check_proxy_saw_header(&self, summary: &mut String) -> Result<(), String> {
        let Some(proxy) = &self.proxy else {
            return Ok(());
        };
        let want = format!("Reversed-VPN: {}", config::REVERSED_VPN_HEADER);
        let heads = proxy.heads();
        if !heads.iter().any(|h| h.lines().any(|l| l == want)) {
            return Err(format!("proxy never saw `{want}`: {heads:?}"));
        }
        let request = heads
            .iter()
            .find_map(|h| h.lines().next())
            .unwrap_or_default();
        summary.push_str(&format!(", proxy got `{request}` + header"));
        Ok(())
    }

    /// [`Scenario::Renegotiate`]: a slow transfer across [`RENEG_RUN`], enough renegotiations
    /// on both sides, started by `initiator` as far as an upstream side shows, and the tunnel
    /// still carrying pings.
    fn renegotiate_under_traffic(
        &self,
        initiator: Side,
        client_tun: IpAddr,
        (s_imp, c_imp): (Impl, Impl),
        summary: &mut String,
    ) -> Result<(), String> {
        let len = SLOW_CHUNK * (RENEG_RUN.as_millis() / SLOW_PAUSE.as_millis()) as usize;
        transfer(
            &self.lab.seed,
            &self.lab.shoot,
            client_tun,
            len,
            SLOW_CHUNK,
            SLOW_PAUSE,
        )?;
        let s_n = logs::renegotiations(s_imp, Side::Server, &self.server.log());
        let c_n = logs::renegotiations(c_imp, Side::Client, &self.client_log());
        summary.push_str(&format!(
            ", {} KiB over 60 s sha256 ok, renegotiations {s_n}/{c_n}",
            len / 1024
        ));
        if s_n < RENEG_MIN || c_n < RENEG_MIN {
            return Err(format!("too few renegotiations (< {RENEG_MIN}): {summary}"));
        }
        // Upstream logs `TLS: soft reset` only for the renegotiations it starts: an
        // upstream side proves who initiated.
        for (imp, side, log) in [
            (s_imp, Side::Server, self.server.log()),
            (c_imp, Side::Client, self.client_log()),
        ] {
            if imp != Impl::Upstream {
                continue;
            }
            let started = log.matches("TLS: soft reset").count();
            let ok = if side == initiator {
                started >= RENEG_MIN
            } else {
                started == 0
            };
            if !ok {
                return Err(format!(
                    "upstream {} started {started} renegotiations: {summary}",
                    side.name()
                ));
            }
        }
        self.ping_both()?;
        Ok(())
    }

    /// After a cut session: waits for the second session, pings both ways and moves 256 KiB.
    fn reconnected_with_traffic(&self) -> Result<(), String> {
        self.wait_sessions(2)?;
        let tun = self.ping_both()?;
        transfer(
            &self.lab.seed,
            &self.lab.shoot,
            tun,
            256 * 1024,
            64 * 1024,
            Duration::ZERO,
        )?;
        Ok(())
    }

    /// [`Scenario::PushOverPath`] once the client reported its tunnel up (after its routes).
    fn push_over_path(
        &self,
        c_imp: Impl,
        routes: &mut Vec<String>,
        mut summary: String,
    ) -> Result<String, String> {
        *routes = self.routes()?;
        let has = |dst: &str| routes.iter().any(|r| r.starts_with(&format!("{dst} ")));
        let (over, ordinary) = ("10.200.2.0/24", "10.250.0.0/16");
        match c_imp {
            Impl::Upstream => {
                if !has(over) {
                    return Err(format!("upstream did not install {over}: {routes:?}"));
                }
                // Its own TCP connection now goes into its tun device.
                if ping(
                    &self.lab.shoot,
                    IpAddr::V4(SERVER_TUN),
                    Duration::from_secs(5),
                )
                .is_ok()
                {
                    return Err(format!("upstream's tunnel survived {over}: {routes:?}"));
                }
                summary.push_str(&format!(
                    ", upstream installed {over} over its path and its tunnel stopped (P9)"
                ));
            }
            Impl::Ours => {
                if has(over) || !has(ordinary) {
                    return Err(format!("expected {ordinary} and not {over}: {routes:?}"));
                }
                self.ping_both()?;
                let log = self.client_log();
                let refused = log.lines().any(|l| {
                    l.contains("refused by the push guard")
                        && l.contains("route 10.200.2.0 255.255.255.0")
                        && l.contains("10.200.2.2")
                });
                if !refused {
                    return Err("our client did not log the refusal with the option's text".into());
                }
                summary.push_str(&format!(
                    ", {over} refused (logged with its text), {ordinary} applied, ping ok (P9)"
                ));
            }
        }
        Ok(summary)
    }

    fn client_log(&self) -> String {
        self.client.as_ref().map(Peer::log).unwrap_or_default()
    }

    /// Waits until the client has brought its tunnel up `n` times and the server has seen
    /// `n` sessions.
    fn wait_sessions(&self, n: usize) -> Result<(), String> {
        let client = self.client.as_ref().ok_or("no client")?;
        let (c_imp, s_imp) = (client.imp(), self.server.imp());
        client.wait_log(&format!("tunnel up #{n}"), UP_TIMEOUT, |l| {
            logs::sessions_up(c_imp, Side::Client, l) >= n
        })?;
        self.server
            .wait_log(&format!("session #{n}"), UP_TIMEOUT, |l| {
                logs::sessions_up(s_imp, Side::Server, l) >= n
            })?;
        Ok(())
    }

    /// Pings the client's tunnel address from SEED and the server's from SHOOT; returns the
    /// client's tunnel address.
    fn ping_both(&self) -> Result<IpAddr, String> {
        let (client_tun, server_tun) = if self.v6 {
            (
                tun_address(&self.lab.shoot, true).ok_or_else(|| {
                    let out = self.lab.shoot.run(["ip", "addr", "show", "dev", "tun0"]);
                    format!("no global IPv6 address on the client's tun0: {out:?}")
                })?,
                IpAddr::V6(config::SERVER_TUN_V6),
            )
        } else {
            (
                tun_address(&self.lab.shoot, false)
                    .ok_or("no IPv4 address on the client's tun0")?,
                IpAddr::V4(SERVER_TUN),
            )
        };
        ping(&self.lab.seed, client_tun, PING_TIMEOUT)
            .map_err(|e| format!("seed -> client: {e}"))?;
        ping(&self.lab.shoot, server_tun, PING_TIMEOUT)
            .map_err(|e| format!("shoot -> server: {e}"))?;
        Ok(client_tun)
    }

    fn keepalive_expiry(&self, c_imp: Impl, s_imp: Impl) -> Result<(), String> {
        let client = self.client.as_ref().ok_or("no client")?;
        // Client: ping-restart 6 s; server: twice that.
        client.wait_log("ping-restart", Duration::from_secs(30), |l| {
            logs::ping_restarted(c_imp, Side::Client, l)
        })?;
        self.server.wait_log(
            "expiry of the silent client",
            Duration::from_secs(30),
            |l| logs::ping_restarted(s_imp, Side::Server, l),
        )?;
        Ok(())
    }

    fn no_common_cipher(&self) -> Result<String, String> {
        let client = self.client.as_ref().ok_or("no client")?;
        let (c_imp, s_imp) = (client.imp(), self.server.imp());
        let timeout = Duration::from_secs(20);
        let s_log = self
            .server
            .wait_log("a no-common-cipher line", timeout, |l| {
                logs::no_common_cipher_line(s_imp, Side::Server, l).is_some()
            })?;
        let c_log = client.wait_log("a refusal line", timeout, |l| {
            logs::no_common_cipher_line(c_imp, Side::Client, l).is_some()
        })?;
        std::thread::sleep(Duration::from_secs(2));
        if logs::sessions_up(c_imp, Side::Client, &client.log()) > 0 {
            return Err("the client brought a tunnel up without a common cipher".into());
        }
        if tun_address(&self.lab.shoot, self.v6).is_some() {
            return Err("the client configured tun0 without a common cipher".into());
        }
        // Upstream's client exits on AUTH_FAILED (no `auth-retry`); ours keeps retrying (C1).
        let after = match c_imp {
            Impl::Upstream => {
                client.wait_log("exit after AUTH_FAILED", Duration::from_secs(10), |_| {
                    client.exited()
                })?;
                "client exited"
            }
            Impl::Ours => {
                if client.exited() {
                    return Err("our client exited after AUTH_FAILED (C1: it retries)".into());
                }
                client.wait_log("a retry after AUTH_FAILED", Duration::from_secs(15), |l| {
                    l.matches("AUTH_FAILED").count() >= 2
                })?;
                "client retries (C1)"
            }
        };
        let s_line = logs::no_common_cipher_line(s_imp, Side::Server, &s_log).unwrap_or_default();
        let c_line = logs::no_common_cipher_line(c_imp, Side::Client, &c_log).unwrap_or_default();
        Ok(format!(
            "refused, {after}; server: «{}» client: «{}»",
            shorten(&s_line),
            shorten(&c_line)
        ))
    }

    /// The client namespace's IPv4 routes as `DST [via GW] dev DEV`, sorted.
    fn routes(&self) -> Result<Vec<String>, String> {
        let out = self
            .lab
            .shoot
            .run(["ip", "-4", "route", "show"])
            .map_err(|e| e.to_string())?;
        let mut routes: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(normalise_route)
            .collect();
        routes.sort();
        Ok(routes)
    }
}

/// [`Scenario::Push`]: the client installed the routes [`PULL_FILTERS`] let through and none
/// of the others; the redirect routes only where an upstream client applied `redirect`.
fn check_pushed_routes(
    routes: &[String],
    redirect: bool,
    c_imp: Impl,
    summary: &mut String,
) -> Result<(), String> {
    for want in PUSH_WANTED {
        if !routes.iter().any(|r| r.starts_with(&format!("{want} "))) {
            return Err(format!("route {want} missing: {routes:?}"));
        }
    }
    for unwanted in PUSH_UNWANTED {
        if routes
            .iter()
            .any(|r| r.starts_with(&format!("{unwanted} ")))
        {
            return Err(format!("route {unwanted} installed: {routes:?}"));
        }
    }
    // Upstream applies an accepted redirect-gateway and a route via net_gateway;
    // ours never does (P7).
    let redirected = redirect && c_imp == Impl::Upstream;
    for r in REDIRECT_ROUTES {
        let there = routes.iter().any(|x| x.starts_with(&format!("{r} ")));
        if there != redirected {
            return Err(format!(
                "route {r} {}: {routes:?}",
                if there { "installed" } else { "missing" }
            ));
        }
    }
    summary.push_str(", routes as filtered");
    if redirect {
        summary.push_str(if redirected {
            ", redirect-gateway and net_gateway route applied"
        } else {
            ", redirect-gateway and net_gateway route not applied (P7)"
        });
    }
    Ok(())
}

/// `10.250.0.0/16 via 192.168.123.1 dev tun0 proto static metric 5` → `10.250.0.0/16 via 192.168.123.1 dev tun0`.
fn normalise_route(line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut out = vec![words.first().copied().unwrap_or_default()];
    for key in ["via", "dev"] {
        if let Some(i) = words.iter().position(|w| *w == key) {
            out.push(key);
            out.push(words.get(i + 1).copied().unwrap_or_default());
        }
    }
    out.join(" ")
}

fn shorten(line: &str) -> String {
    const MAX: usize = 110;
    if line.len() <= MAX {
        return line.to_owned();
    }
    let mut end = MAX;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}
