//! The demo: what the project can do today, end to end, in a network namespace of its own.
//!
//! Today that is the wire layer: upstream OpenVPN 2.6 runs as a tls-auth TCP server in a fresh
//! namespace, and our `protocol` crate opens a session with it (hard reset out, the server's
//! hard reset back, authenticated, parsed and acknowledged), once per control-channel
//! protection. The namespace, the server and the throwaway PKI are removed at the end, also
//! on failure. It grows into a seed and a shoot with traffic crossing the tunnel with the
//! `vpn-server` / `vpn-client` issue.

#![allow(clippy::print_stdout)] // Printing the summary is what this program is for.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use conformance::netns::Netns;
use conformance::pki_fixture::TestPki;
use conformance::probe::{hard_reset_exchange, hex, Protection};
use conformance::upstream::{tcp_server_config, ControlWrap, UpstreamOpenvpn};
use conformance::{check_lab, LabError};
use protocol::digest::Digest;
use protocol::ids::SessionId;
use protocol::static_key;

const PORT: u16 = 1194;
const TIMEOUT: Duration = Duration::from_secs(10);

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                msg = format!("{msg}: {cause}");
                source = cause.source();
            }
            eprintln!("demo failed: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), LabError> {
    check_lab(&["openvpn", "openssl"])?;
    let started = Instant::now();
    let openvpn_version = std::process::Command::new("openvpn")
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .unwrap_or_default();
    println!("peer: {openvpn_version}");

    let pki = TestPki::generate()?;
    let key = static_key::parse(&pki.ta_key_text()?).map_err(|e| LabError::Protocol {
        what: "parse of ta.key".into(),
        source: Box::new(e),
    })?;
    let cases = [
        (
            "tls-auth, auth SHA1",
            Protection::TlsAuth(Digest::Sha1),
            ControlWrap::TlsAuth,
            None,
        ),
        (
            "tls-auth, auth SHA256",
            Protection::TlsAuth(Digest::Sha256),
            ControlWrap::TlsAuth,
            Some("auth SHA256"),
        ),
        (
            "tls-crypt",
            Protection::TlsCrypt,
            ControlWrap::TlsCrypt,
            None,
        ),
    ];
    for (name, protection, wrap, extra) in cases {
        let ns = Netns::new()?;
        let extra: Vec<&str> = extra.into_iter().collect();
        let server = UpstreamOpenvpn::start(&ns, &tcp_server_config(&pki, PORT, wrap, &extra), 3)?;
        server.wait_listening(TIMEOUT)?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let client_sid = SessionId::random(&mut rand_core::OsRng);
        let exchange = ns.run_in(|| {
            hard_reset_exchange(
                SocketAddr::from((Ipv4Addr::LOCALHOST, PORT)),
                &key,
                protection,
                client_sid,
                u32::try_from(now).unwrap_or(u32::MAX),
                TIMEOUT,
            )
        })??;
        let reply = exchange.reply().map_err(|e| LabError::Protocol {
            what: "parse of the reply".into(),
            source: Box::new(e),
        })?;
        println!();
        println!("== {name} (namespace {})", ns.name());
        println!(
            "  -> {:>3} B  our hard reset      {}",
            exchange.sent.len(),
            hex(&exchange.sent)
        );
        println!(
            "  <- {:>3} B  upstream's reply    {}",
            exchange.reply_wire.len(),
            hex(&exchange.reply_wire)
        );
        println!(
            "     decoded: {:?} key_id {} sid {} acks {:?} remote sid {} msg {:?}",
            reply.opcode,
            reply.key_id.get(),
            reply.session_id,
            reply
                .acks
                .as_slice()
                .iter()
                .map(|m| m.0)
                .collect::<Vec<_>>(),
            reply
                .remote_session_id
                .map(|s| s.to_string())
                .unwrap_or_default(),
            reply.message_id.map(|m| m.0),
        );
        println!(
            "  -> {:>3} B  our ACK             {}",
            exchange.ack_sent.len(),
            hex(&exchange.ack_sent)
        );
        let accepted = server.log().contains("TLS: Initial packet from");
        println!(
            "     upstream log: {}",
            if accepted {
                "accepted our session (\"TLS: Initial packet from\")"
            } else {
                "no sign of our session"
            }
        );
        if !accepted || reply.remote_session_id != Some(client_sid) {
            return Err(LabError::Protocol {
                what: format!("{name}: upstream did not take our hard reset"),
                source: "no acknowledgement of our session".into(),
            });
        }
    }
    println!();
    println!(
        "summary: 3 of 3 control-channel protections interoperate with upstream OpenVPN at the \
         wire layer; {:.1} s; namespaces, processes and PKI removed.",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
