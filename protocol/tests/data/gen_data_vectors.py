#!/usr/bin/env python3
"""Independent known-answer vectors for the data channel (protocol/tests/data_kat.rs).

Builds OpenVPN 2.6 data packets (reference sections 7.3, 8.1-8.3) with Python's
`cryptography` package (AESGCM, ChaCha20Poly1305, AES-CBC) and the stdlib `hmac`, from the
key2 block of the reference's KAT (section 7.1). Run:

    python3 protocol/tests/data/gen_data_vectors.py

and paste the printed constants into data_kat.rs. The script first re-derives the reference's
own AES-256-GCM and AES-256-CBC+SHA1 packets as a self-check.
"""

import hashlib
import hmac

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

KEY2 = bytes.fromhex(
    "72344b92208ff03a1063f3bc96b0a052e478e56bfe3de63672fabdb19acbde84"
    "6671acec1e358df4b30d46ec758398b110232f683dddfccfb992d4c341682662"
    "8078818a396e6c222bd16d65c400cce8c13c97b2ace38716562bb30a43f275ca"
    "8211118ee10a6f38188be544f05b4ee7a8049af230228dfd33aeadc80850ea82"
    "2e5835792c6cb49bffad1c65ba31a8e66bc8b81a8c8213d5c452260b2930370a"
    "12f0dee1abeaad6a2afce33771fb4cb55d61ce3fee4a7f04082d31a8e3b430f0"
    "863e112df3c18ad32a12116f29b23d8e565d4e074ce2e9195b03047913a552df"
    "81dc3cae2698fc6110b61065a0eba3caa61c59ab43f193882de4d733a30399ac"
)
PING = bytes.fromhex("2a187bf3641eb4cb07ed2d0a981fc748")


def slots(sender):
    """(cipher slot, hmac slot) the sender encrypts with: client key[0], server key[1]."""
    base = 0 if sender == "client" else 128
    return KEY2[base : base + 64], KEY2[base + 64 : base + 128]


def header(v2, key_id, peer_id=0):
    if v2:
        return bytes([0x48 | key_id]) + peer_id.to_bytes(3, "big")
    return bytes([0x30 | key_id])


def aead_packet(aead_cls, key_len, sender, hdr, pid, payload):
    ckey, hslot = slots(sender)
    aead = aead_cls(ckey[:key_len])
    pid_b = pid.to_bytes(4, "big")
    nonce = pid_b + hslot[:8]
    aad = (hdr + pid_b) if len(hdr) == 4 else pid_b
    ct_tag = aead.encrypt(nonce, payload, aad)
    ct, tag = ct_tag[:-16], ct_tag[-16:]
    return hdr + pid_b + tag + ct


def cbc_packet(key_len, digest, sender, hdr, pid, payload, iv):
    ckey, hslot = slots(sender)
    plain = pid.to_bytes(4, "big") + payload
    pad = 16 - len(plain) % 16
    plain += bytes([pad]) * pad
    enc = Cipher(algorithms.AES(ckey[:key_len]), modes.CBC(iv)).encryptor()
    ct = enc.update(plain) + enc.finalize()
    hkey = hslot[: hashlib.new(digest).digest_size]
    mac = hmac.new(hkey, iv + ct, digest).digest()
    return hdr + mac + iv + ct


def emit(name, comment, fields):
    print(f"/// {comment}")
    print(f"pub const {name}: Vector = Vector {{")
    for k, v in fields:
        print(f"    {k}: {v},")
    print("};")
    print()


def main():
    # Self-check against the reference (8.2, 8.3).
    v2 = aead_packet(AESGCM, 32, "client", header(True, 0), 1, PING)
    assert v2.hex() == (
        "4800000000000001" "4ddcf213f26cc179ffc3df0884071e53" "fd78e65dcb492030d67aa08a3d3d14e8"
    ), v2.hex()
    v1 = aead_packet(AESGCM, 32, "client", header(False, 0), 1, PING)
    assert v1.hex() == (
        "3000000001" "6f4aedb8696698dd683c0f9e2b8e04cc" "fd78e65dcb492030d67aa08a3d3d14e8"
    ), v1.hex()
    cbc = cbc_packet(32, "sha1", "client", header(True, 0), 1, PING, bytes(range(0xF0, 0x100)))
    assert cbc.hex() == (
        "48000000" "59fe4f19ab45b164bb006a50816b46c2e7f18b03" "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff"
        "7bdb80653fd02df2110810bd2864f6f63475011019c6a1dde2551bcab1c1c5f2"
    ), cbc.hex()

    payload_a = bytes((i * 7 + 3) & 0xFF for i in range(100))
    payload_b = bytes((i * 13 + 1) & 0xFF for i in range(47))
    iv = bytes.fromhex("000102030405060708090a0b0c0d0e0f")

    cases = [
        ("AES_128_GCM_V2", "AES-128-GCM, client->server, P_DATA_V2 key_id 2 peer_id 0x123456, pid 0x01020304, 100-byte payload",
         "Aes128Gcm", None, "client", True, 2, 0x123456, 0x01020304, payload_a, None),
        ("CHACHA20_POLY1305_V1", "CHACHA20-POLY1305, server->client, P_DATA_V1 key_id 1, pid 7, 47-byte payload",
         "ChaCha20Poly1305", None, "server", False, 1, 0, 7, payload_b, None),
        ("AES_256_CBC_SHA256_V2", "AES-256-CBC + SHA256, server->client, P_DATA_V2 key_id 0 peer_id 5, pid 2, 100-byte payload, IV 00..0f",
         "Aes256Cbc", "sha256", "server", True, 0, 5, 2, payload_a, iv),
        ("AES_128_CBC_SHA512_V1", "AES-128-CBC + SHA512, client->server, P_DATA_V1 key_id 7, pid 0xfeffffff, 47-byte payload, IV 00..0f",
         "Aes128Cbc", "sha512", "client", False, 7, 0, 0xFEFFFFFF, payload_b, iv),
    ]
    for name, comment, cipher, digest, sender, isv2, key_id, peer_id, pid, payload, civ in cases:
        hdr = header(isv2, key_id, peer_id)
        if cipher == "Aes128Gcm":
            pkt = aead_packet(AESGCM, 16, sender, hdr, pid, payload)
        elif cipher == "ChaCha20Poly1305":
            pkt = aead_packet(ChaCha20Poly1305, 32, sender, hdr, pid, payload)
        elif cipher == "Aes256Cbc":
            pkt = cbc_packet(32, digest, sender, hdr, pid, payload, civ)
        else:
            pkt = cbc_packet(16, digest, sender, hdr, pid, payload, civ)
        dig = {None: "None", "sha256": "Some(Digest::Sha256)", "sha512": "Some(Digest::Sha512)"}[digest]
        emit(name, comment, [
            ("cipher", f"DataCipher::{cipher}"),
            ("digest", dig),
            ("sender", "Role::Client" if sender == "client" else "Role::Server"),
            ("packet_id", hex(pid)),
            ("iv", f'"{civ.hex()}"' if civ else '""'),
            ("payload", f'"{payload.hex()}"'),
            ("wire", f'"{pkt.hex()}"'),
        ])


if __name__ == "__main__":
    main()
