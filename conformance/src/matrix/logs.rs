//! What the peers' logs say: tunnel up, negotiated cipher, key derivation, renegotiations,
//! session loss. One function per fact, each knowing both implementations' wording.

use super::peer::{Impl, Side};

/// The line a side logs when its tunnel is usable (a server: when it is ready for clients).
pub fn up_marker(imp: Impl, side: Side) -> &'static str {
    match (imp, side) {
        (Impl::Ours, Side::Client) => "tunnel up",
        _ => "Initialization Sequence Completed",
    }
}

/// How many times a client's tunnel came up (a server: how many sessions got keys and a cipher).
pub fn sessions_up(imp: Impl, side: Side, log: &str) -> usize {
    match (imp, side) {
        (Impl::Ours, Side::Server) => log.matches("tunnel established").count(),
        (Impl::Upstream, Side::Server) => log.matches("Data Channel: cipher '").count(),
        _ => log.matches(up_marker(imp, side)).count(),
    }
}

/// The data cipher a side reports for its last session.
pub fn cipher(imp: Impl, log: &str) -> Option<String> {
    match imp {
        // `Data Channel: cipher 'AES-256-GCM', peer-id: 0`
        Impl::Upstream => log
            .rsplit("Data Channel: cipher '")
            .next()
            .filter(|_| log.contains("Data Channel: cipher '"))
            .and_then(|rest| rest.split('\'').next())
            .map(str::to_owned),
        // `... cipher="AES-256-GCM" ...` (tracing's field format)
        Impl::Ours => field(log, "cipher="),
    }
}

/// How a side derived its data keys in its last session: `ekm` (TLS exporter) or `prf`.
pub fn key_derivation(imp: Impl, side: Side, log: &str) -> Option<&'static str> {
    let ekm = match (imp, side) {
        (Impl::Ours, _) => field(log, "tls_ekm=")? == "true",
        // The pushed options say it: `key-derivation tls-ekm` or `protocol-flags ... tls-ekm`.
        (Impl::Upstream, Side::Client) => last_line(log, "PUSH_REPLY")?.contains("tls-ekm"),
        (Impl::Upstream, Side::Server) => last_line(log, "SENT CONTROL")
            .filter(|l| l.contains("PUSH_REPLY"))?
            .contains("tls-ekm"),
    };
    Some(if ekm { "ekm" } else { "prf" })
}

/// The last `PUSH_REPLY` an upstream client received, as its log quotes it.
pub fn received_push_reply(log: &str) -> Option<String> {
    const MARK: &str = "PUSH: Received control message: '";
    let line = last_line(log, MARK)?;
    let rest = &line[line.find(MARK)? + MARK.len()..];
    let text = rest.strip_suffix('\'').unwrap_or(rest);
    text.starts_with("PUSH_REPLY").then(|| text.to_owned())
}

/// How many data-channel keys a side installed after the first (renegotiations it saw).
pub fn renegotiations(imp: Impl, side: Side, log: &str) -> usize {
    match (imp, side) {
        (Impl::Ours, Side::Client) => log.matches("data key renegotiated").count(),
        (Impl::Ours, Side::Server) => log.matches("key renegotiated").count(),
        // Every key, the first included, is announced once per direction.
        (Impl::Upstream, _) => log
            .matches("Outgoing Data Channel: Cipher")
            .count()
            .saturating_sub(1),
    }
}

/// Whether a side reported losing its session to the keepalive timeout.
pub fn ping_restarted(imp: Impl, side: Side, log: &str) -> bool {
    match (imp, side) {
        (Impl::Ours, Side::Client) => log.contains("ping-restart"),
        (Impl::Ours, Side::Server) => log.contains("client disconnected"),
        (Impl::Upstream, _) => log.contains("Inactivity timeout (--ping-restart)"),
    }
}

/// The line each side logs when no cipher is shared: `Some(line)` if present.
pub fn no_common_cipher_line(imp: Impl, side: Side, log: &str) -> Option<String> {
    let needles: &[&str] = match (imp, side) {
        (Impl::Upstream, Side::Server) => &["No common cipher"],
        (Impl::Upstream, Side::Client) => &["AUTH_FAILED", "no shared cipher"],
        (Impl::Ours, Side::Server) => &["refused: cipher negotiation failed", "no shared cipher"],
        (Impl::Ours, Side::Client) => &["AUTH_FAILED", "no shared cipher"],
    };
    let line = log
        .lines()
        .find(|l| needles.iter().all(|n| l.contains(n)))?;
    // From the first needle on: the timestamp and target add nothing.
    let at = line.find(needles[0]).unwrap_or(0);
    Some(line[at..].trim().to_owned())
}

/// The value after the last `name` in `log` (tracing field), quotes removed.
fn field(log: &str, name: &str) -> Option<String> {
    let rest = log.rsplit(name).next().filter(|_| log.contains(name))?;
    let rest = rest.trim_start_matches('"');
    let end = rest
        .find(|c: char| c == '"' || c.is_whitespace())
        .unwrap_or(rest.len());
    Some(rest[..end].to_owned())
}

fn last_line<'a>(log: &'a str, needle: &str) -> Option<&'a str> {
    log.lines().rev().find(|l| l.contains(needle))
}
