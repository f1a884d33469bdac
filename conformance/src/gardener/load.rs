//! The kube-apiserver's load of issue 29's hold replays (`tests/hold_replay.rs` on the non-HA
//! paths, `tests/hold_replay_ha.rs` on the HA kube-apiserver pod's own tunnels): requests of two
//! kinds started every [`INTERVAL`] ([`load`]), what each did ([`Rec`]), the events they ran
//! through ([`Event`], each begun once the requests before it have ended: [`InFlight`]), the tunnel's own downtime from a fast ping through it ([`Pinger`]), the
//! figures (`hold figure:` lines, [`report`]), what the phases assert ([`held_problems`],
//! [`old_problems`]) and the capture filter for packets to the shoot ([`to_shoot_filter`]).

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::capture::Capture;
use crate::netns::Netns;
use crate::LabError;

/// How often each kind of request starts.
pub const INTERVAL: Duration = Duration::from_millis(100);
/// What a request may take beyond the tunnel's downtime.
pub const SLACK: Duration = Duration::from_secs(1);
/// How long one request may take in all.
pub const REQUEST_BOUND: Duration = Duration::from_secs(25);
/// The short bound of the replays' second phase (the servers' hold and the sidecars').
pub const SHORT: Duration = Duration::from_millis(1500);
/// How long the shoot side stays away in the second phase.
pub const AWAY: Duration = Duration::from_secs(4);

/// A kube-apiserver request's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `kubectl exec`-like: a stream to the kubelet.
    Exec,
    /// An admission webhook call: a fresh TCP connection to the webhook pod.
    Webhook,
}

/// One request of the load.
#[derive(Debug, Clone)]
pub struct Rec {
    /// Its kind.
    pub kind: Kind,
    /// When it started.
    pub started: Instant,
    /// From its start to its answer (or failure).
    pub took: Duration,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// The start times of the requests still running. An event begins once every request
/// started before it has ended ([`InFlight::quiesce`]), so a request is judged against the
/// event it started in and never against the next one's downtime (a request started just
/// before an uplink cut was counted as a client restart's 6.6 s exec).
#[derive(Debug, Default)]
pub struct InFlight(Mutex<Vec<Instant>>);

impl InFlight {
    fn running(&self) -> std::sync::MutexGuard<'_, Vec<Instant>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn begin(&self) -> Instant {
        let now = Instant::now();
        self.running().push(now);
        now
    }

    fn end(&self, started: Instant) {
        let mut running = self.running();
        if let Some(i) = running.iter().position(|&s| s == started) {
            running.swap_remove(i);
        }
    }

    /// Waits until no request started before now is running, at most `bound` (a request
    /// stuck longer fails its own bound).
    pub fn quiesce(&self, bound: Duration) {
        let now = Instant::now();
        while self.running().iter().any(|&s| s < now) && now.elapsed() < bound {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// One event the load runs through.
#[derive(Debug, Clone)]
pub struct Event {
    /// What happened (`server SIGKILL`, ...).
    pub name: String,
    /// Before its action.
    pub begin: Instant,
    /// Its action done (the process gone, the link down).
    pub down: Instant,
    /// The first echo reply sent after `down` arrived.
    pub back: Instant,
    /// A listener that went down with the event's process (the non-HA in-process sidecar's)
    /// was gone from `begin` until this; `None` where none went.
    pub listener_back: Option<Instant>,
    /// The longest time without an echo reply in the event's window, where the test measures
    /// it (zero elsewhere): a path that moves twice (away and back) can stall after `back`.
    pub gap: Duration,
}

impl Event {
    /// The tunnel's own downtime: from the event's start to its first echo reply, or the
    /// longest [`Event::gap`] if that is longer.
    pub fn downtime(&self) -> Duration {
        (self.back - self.begin).max(self.gap)
    }
}

/// The `ping` through the tunnel: its output file and the clock pairing to read it.
#[derive(Debug)]
pub struct Pinger {
    out: PathBuf,
    epoch: (Instant, SystemTime),
    bound: Duration,
}

impl Pinger {
    /// Pings `target` from `ns` every 20 ms (at most 15000 echoes, 300 s), its output in
    /// `dir`; [`Pinger::wait_back`] waits at most `bound` for a reply.
    pub fn start(
        ns: &Netns,
        dir: &Path,
        target: Ipv4Addr,
        bound: Duration,
    ) -> Result<Pinger, LabError> {
        let out = dir.join(format!("ping-{target}.out"));
        let file = std::fs::File::create(&out).map_err(|source| LabError::io(&out, source))?;
        let mut cmd = ns.command("stdbuf");
        // No `-w`: with a deadline, ping ends at its first ICMP error (a server's host
        // unreachable at a short bound).
        cmd.args(["-oL", "ping", "-D", "-n", "-i", "0.02", "-c", "15000"])
            .arg(target.to_string())
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(Stdio::null());
        ns.spawn(&mut cmd)?;
        Ok(Pinger {
            out,
            epoch: (Instant::now(), SystemTime::now()),
            bound,
        })
    }

    /// The echo replies so far: when each was sent and when it arrived.
    fn replies(&self) -> Vec<(Instant, Instant)> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let (i0, s0) = self.epoch;
        let Ok(base) = s0.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()) else {
            return Vec::new();
        };
        let at = |secs: f64| i0 + Duration::from_secs_f64(secs.max(0.0));
        text.lines()
            .filter_map(|line| {
                let ts: f64 = line.strip_prefix('[')?.split(']').next()?.parse().ok()?;
                let ms: f64 = line
                    .split("time=")
                    .nth(1)?
                    .split(' ')
                    .next()?
                    .parse()
                    .ok()?;
                let received = ts - base;
                (received >= 0.0).then(|| (at(received - ms / 1e3), at(received)))
            })
            .collect()
    }

    /// The first reply to an echo sent after `after`: when it arrived.
    pub fn back_after(&self, after: Instant) -> Option<Instant> {
        self.replies()
            .into_iter()
            .find(|(sent, _)| *sent > after)
            .map(|(_, received)| received)
    }

    /// The longest time without a reply between `from` and `to` ([`super::ha::max_gap`]).
    pub fn longest_gap(&self, from: Instant, to: Instant) -> Duration {
        let arrivals: Vec<Instant> = self.replies().into_iter().map(|(_, r)| r).collect();
        super::ha::max_gap(&arrivals, from, to)
    }

    /// [`Pinger::back_after`], waited for; panics (the test fails) after the bound.
    pub fn wait_back(&self, after: Instant, what: &str) -> Instant {
        let deadline = Instant::now() + self.bound;
        loop {
            if let Some(at) = self.back_after(after) {
                return at;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: the tunnel never came back"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The kube-apiserver's load until `stop`: `request(kind, n)` for both kinds every
/// [`INTERVAL`], each on a thread of its own and counted in `inflight` while it runs; at most
/// `max_requests` and for at most `limit`. Returns when every request has ended.
pub fn load(
    stop: &AtomicBool,
    inflight: &InFlight,
    max_requests: usize,
    limit: Duration,
    request: impl Fn(Kind, usize) -> Result<(), String> + Sync,
) -> Vec<Rec> {
    let recs = Mutex::new(Vec::new());
    let begun = Instant::now();
    std::thread::scope(|s| {
        let mut next = Instant::now();
        let mut count = 0usize;
        while !stop.load(Ordering::Relaxed) && begun.elapsed() < limit && count < max_requests {
            for kind in [Kind::Exec, Kind::Webhook] {
                count += 1;
                let (recs, request) = (&recs, &request);
                s.spawn(move || {
                    let started = inflight.begin();
                    let outcome = request(kind, count);
                    let took = started.elapsed();
                    inflight.end(started);
                    recs.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(Rec {
                            kind,
                            started,
                            took,
                            error: outcome.err(),
                        });
                });
            }
            next += INTERVAL;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    });
    recs.into_inner().unwrap_or_else(PoisonError::into_inner)
}

/// A line there and back on `s`.
pub fn exchange(s: &mut (impl Read + Write), n: usize) -> Result<(), String> {
    exchange_line(s, &format!("request {n}\n"))
}

/// `line` there and the same line back on `s`.
pub fn exchange_line(s: &mut (impl Read + Write), line: &str) -> Result<(), String> {
    s.write_all(line.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut back = vec![0u8; line.len()];
    s.read_exact(&mut back).map_err(|e| format!("read: {e}"))?;
    if back != line.as_bytes() {
        return Err(format!(
            "echo differs: {:?}",
            String::from_utf8_lossy(&back)
        ));
    }
    Ok(())
}

/// A fresh TCP connection to `target` (an echo), a line there and back, each step bounded by
/// `bound`; run it inside the sender's namespace. A refusal by ICMP host unreachable says
/// `EHOSTUNREACH`.
pub fn tcp_request(target: SocketAddr, bound: Duration, n: usize) -> Result<(), String> {
    let mut s = TcpStream::connect_timeout(&target, bound).map_err(|e| {
        format!(
            "connect: {e}{}",
            if e.kind() == ErrorKind::HostUnreachable {
                " (EHOSTUNREACH)"
            } else {
                ""
            }
        )
    })?;
    let _ = s.set_read_timeout(Some(bound));
    exchange(&mut s, n)
}

/// The requests that started in `e`'s window (until `next`).
pub fn window<'r>(recs: &'r [Rec], e: &Event, next: Option<Instant>) -> Vec<&'r Rec> {
    recs.iter()
        .filter(|r| r.started >= e.begin && next.is_none_or(|n| r.started < n))
        .collect()
}

/// Ends `captures` (what each watched, its capture) and lists every packet they saw, each
/// with what saw it: packets to the shoot that left by an interface they must not.
pub fn leaked(captures: Vec<(String, Capture<'_>)>) -> Vec<String> {
    let mut leaked = Vec::new();
    for (what, c) in captures {
        for p in c.finish().expect("capture") {
            leaked.push(format!("{what}: {p}"));
        }
    }
    leaked
}

/// `d` in whole milliseconds.
pub fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

/// Prints the figures of a phase (a `hold figure:` line per event: requests started, failed,
/// the longest wait, the tunnel's downtime, per kind); returns its failures with the events
/// they started in.
pub fn report(path: &str, phase: &str, events: &[Event], recs: &[Rec]) -> Vec<(String, Rec)> {
    let mut failures = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let mine = window(recs, e, events.get(i + 1).map(|n| n.begin));
        let failed: Vec<&&Rec> = mine.iter().filter(|r| r.error.is_some()).collect();
        let longest = mine.iter().map(|r| r.took).max().unwrap_or_default();
        let per_kind = |k: Kind| {
            let of: Vec<&&Rec> = mine.iter().filter(|r| r.kind == k).collect();
            let f = of.iter().filter(|r| r.error.is_some()).count();
            let long = of.iter().map(|r| r.took).max().unwrap_or_default();
            format!("{} started, {f} failed, longest {}", of.len(), ms(long))
        };
        eprintln!(
            "hold figure: {path} | {phase} | {} | {} started, {} failed, longest wait {} | \
             tunnel down {} | exec: {} | webhook: {}",
            e.name,
            mine.len(),
            failed.len(),
            ms(longest),
            ms(e.downtime()),
            per_kind(Kind::Exec),
            per_kind(Kind::Webhook),
        );
        for r in failed {
            failures.push((e.name.clone(), (**r).clone()));
        }
    }
    failures
}

/// What a phase with the holds on must show, per event: no request longer than the tunnel's
/// downtime and [`SLACK`], none failed. `excuse(event, rec)` names why a request that failed
/// or took longer is none of the hold's doing (printed, not counted), or `None`.
pub fn held_problems(
    path: &str,
    events: &[Event],
    recs: &[Rec],
    excuse: impl Fn(&Event, &Rec) -> Option<&'static str>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let next = events.get(i + 1).map(|n| n.begin);
        let down = e.downtime();
        for r in window(recs, e, next) {
            let what = match &r.error {
                None if r.took <= down + SLACK => continue,
                None => format!("took {}, the tunnel was down {}", ms(r.took), ms(down)),
                Some(err) => format!("failed after {}: {err}", ms(r.took)),
            };
            if let Some(why) = excuse(e, r) {
                match &r.error {
                    Some(err) => {
                        eprintln!("hold figure: {path} | held | {}: {why}: {err}", e.name);
                    }
                    None => eprintln!(
                        "hold figure: {path} | held | {}: {why}: a {:?} request {what}",
                        e.name, r.kind
                    ),
                }
            } else {
                problems.push(format!("{path} {}: a {:?} request {what}", e.name, r.kind));
            }
        }
    }
    problems
}

/// What a phase with the holds off must show: some request failed (printed), and each at
/// once: within twice [`SLACK`] of its start (the kernel's first SYN retransmit, 1 s, when the
/// first SYN met no server).
pub fn old_problems(path: &str, failures: &[(String, Rec)]) -> Vec<String> {
    for (event, r) in failures {
        eprintln!(
            "hold figure: {path} | old | {event}: a {:?} request failed after {}: {}",
            r.kind,
            ms(r.took),
            r.error.as_deref().unwrap_or("")
        );
    }
    let mut problems: Vec<String> = failures
        .iter()
        .filter(|(_, r)| r.took > SLACK * 2)
        .map(|(event, r)| {
            format!(
                "{path} old {event}: a {:?} request failed only after {}",
                r.kind,
                ms(r.took)
            )
        })
        .collect();
    if failures.is_empty() {
        problems.push(format!("{path}: with the holds off no request failed"));
    }
    problems
}

/// A pcap filter for packets to any of `nets` (`dst net`) or `hosts` (`dst host`).
pub fn to_shoot_filter(nets: &[&str], hosts: &[&str]) -> String {
    let terms: Vec<String> = nets
        .iter()
        .map(|n| format!("dst net {n}"))
        .chain(hosts.iter().map(|h| format!("dst host {h}")))
        .collect();
    format!("({})", terms.join(" or "))
}
