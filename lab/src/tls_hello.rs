//! A TLS ClientHello record to send where only its server name matters: SNI routers and
//! load balancers in TCP mode read it and pass it on; no handshake follows.

/// A ClientHello record for `server_name`, in the shape a browser or `kubectl` sends (TLS 1.3,
/// without padding): `server_name`, `supported_groups`, `signature_algorithms`,
/// `supported_versions` and an X25519 `key_share`. Random, session id and key are fixed bytes:
/// nothing on the path looks at them.
pub fn client_hello(server_name: &str) -> Vec<u8> {
    let mut ext = Vec::new();
    let mut push_ext = |kind: u16, data: &[u8]| {
        ext.extend_from_slice(&kind.to_be_bytes());
        ext.extend_from_slice(&u16_len(data.len()));
        ext.extend_from_slice(data);
    };
    let mut sni = u16_len(server_name.len() + 3).to_vec();
    sni.push(0);
    sni.extend_from_slice(&u16_len(server_name.len()));
    sni.extend_from_slice(server_name.as_bytes());
    push_ext(0x0000, &sni);
    push_ext(0x000a, &[0, 4, 0x00, 0x1d, 0x00, 0x17]);
    push_ext(0x000d, &[0, 6, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01]);
    push_ext(0x002b, &[2, 0x03, 0x04]);
    let mut key_share = vec![0, 36, 0x00, 0x1d, 0, 32];
    key_share.extend_from_slice(&[0x5a; 32]);
    push_ext(0x0033, &key_share);

    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[0x42; 32]);
    body.push(32);
    body.extend_from_slice(&[0x17; 32]);
    body.extend_from_slice(&[0, 6, 0x13, 0x01, 0x13, 0x02, 0x13, 0x03]);
    body.extend_from_slice(&[1, 0]);
    body.extend_from_slice(&u16_len(ext.len()));
    body.extend_from_slice(&ext);

    let len = u32::try_from(body.len()).unwrap_or(0).to_be_bytes();
    let mut message = vec![1, len[1], len[2], len[3]];
    message.extend_from_slice(&body);
    let mut record = vec![22, 3, 1];
    record.extend_from_slice(&u16_len(message.len()));
    record.extend_from_slice(&message);
    record
}

fn u16_len(n: usize) -> [u8; 2] {
    u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_frames_a_client_hello_naming_the_server() {
        let hello = client_hello("api.a.example");
        assert_eq!(&hello[..3], &[22, 3, 1], "a handshake record");
        let record_len = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
        assert_eq!(hello.len(), 5 + record_len);
        assert_eq!(hello[5], 1, "a ClientHello");
        let needle = b"api.a.example";
        assert!(hello.windows(needle.len()).any(|w| w == needle));
    }
}
