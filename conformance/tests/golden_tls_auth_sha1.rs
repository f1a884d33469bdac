//! The committed golden capture `protocol/tests/golden/tls-auth-sha1` is consistent with the
//! reference: every key_id 0 control packet authenticates with the right key direction, replay
//! packet-ids count up from 1 per direction, and the first exchange is the 42/54-byte hard
//! reset pair that ACKs message 0 and names the peer's sid.

mod common;
use common::local_tls_auth::{self, Sender};

const GOLDEN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../protocol/tests/golden/tls-auth-sha1"
);

fn packets(file: &str) -> Vec<Vec<u8>> {
    let text = std::fs::read_to_string(format!("{GOLDEN}/{file}")).expect("golden file");
    text.lines()
        .map(|line| hex::decode(line).expect("hex line"))
        .collect()
}

#[test]
fn golden_tls_auth_sha1_control_packets_verify() {
    let key = local_tls_auth::parse_static_key(
        &std::fs::read_to_string(format!("{GOLDEN}/ta.key")).expect("ta.key"),
    )
    .expect("static key");
    let c2s = packets("c2s.hex");
    let s2c = packets("s2c.hex");

    let mut sids = Vec::new();
    for (name, pkts, sender) in [("c2s", &c2s, Sender::Dir1), ("s2c", &s2c, Sender::Dir0)] {
        // key_id 0 control packets: opcodes 3..=8, low 3 bits 0.
        let control: Vec<_> = pkts
            .iter()
            .filter(|p| p[0] & 7 == 0 && !matches!(p[0] >> 3, 6 | 9))
            .collect();
        assert!(
            control.len() >= 6,
            "{name}: {} control packets",
            control.len()
        );
        for (i, p) in control.iter().enumerate() {
            let parsed = local_tls_auth::parse(&key, p, sender)
                .unwrap_or_else(|e| panic!("{name} #{i}: {e}"));
            assert_eq!(
                parsed.replay_pid,
                u32::try_from(i + 1).expect("small"),
                "{name} #{i}"
            );
        }
        sids.push(
            local_tls_auth::parse(&key, control[0], sender)
                .expect("first")
                .own_sid,
        );
    }

    assert_eq!(c2s[0].len(), 42, "HARD_RESET_CLIENT_V2 with SHA1 tls-auth");
    assert_eq!(c2s[0][0], 0x38);
    assert_eq!(s2c[0].len(), 54, "HARD_RESET_SERVER_V2 with SHA1 tls-auth");
    assert_eq!(s2c[0][0], 0x40);
    let reply = local_tls_auth::parse_from_server(&key, &s2c[0]).expect("server reset");
    assert_eq!(reply.acks, vec![0]);
    assert_eq!(reply.remote_sid, Some(sids[0]));
    assert_eq!(reply.msg_id, Some(0));
}
