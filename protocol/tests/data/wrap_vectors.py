#!/usr/bin/env python3
"""Independent tls-auth / tls-crypt (v1) vectors for protocol/tests/wrap_kat.rs.

Written from the wire description in the reference (sections 2.2, 2.3, 3.2-3.4), not from
our Rust code. Uses only Python's hmac/hashlib and `cryptography` for AES-256-CTR.
Run: python3 protocol/tests/data/wrap_vectors.py   (prints the Rust constants)

Every vector uses the static key 00 01 .. ff, own session id 0102030405060708 and
net_time 0x5f5e1000. Each sender wraps two packets in order, so the first carries replay
packet id 1 and the second id 2 (same net_time):
  1. its hard reset (client: P_CONTROL_HARD_RESET_CLIENT_V2, msg id 0, no acks;
     server: P_CONTROL_HARD_RESET_SERVER_V2 acking msg 0 of remote sid a1..a8, msg id 0);
  2. a P_CONTROL_V1 (key id 1) acking [5, 4] of remote sid a1..a8, msg id 6, 21-byte payload.
"""
import hashlib
import hmac
import struct

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

KEY = bytes(range(256))
SID = bytes.fromhex("0102030405060708")
REMOTE_SID = bytes.fromhex("a1a2a3a4a5a6a7a8")
TIME = 0x5F5E1000
PAYLOAD = bytes.fromhex("1703030010") + bytes(range(16))


def slot(key_index, kind):
    """64-byte slot: kind 0 = cipher, 1 = hmac (reference 3.2)."""
    base = key_index * 128 + kind * 64
    return KEY[base : base + 64]


def send_key_index(direction):
    """Which key a sender uses: direction 0 -> key[0], 1 -> key[1], None -> key[0]."""
    return 1 if direction == 1 else 0


def hard_reset(role):
    if role == "client":
        return bytes([7 << 3]) + SID + b"\x00" + struct.pack(">I", 0)
    return (
        bytes([8 << 3]) + SID + b"\x01" + struct.pack(">I", 0) + REMOTE_SID + struct.pack(">I", 0)
    )


def control_v1():
    return (
        bytes([4 << 3 | 1])
        + SID
        + b"\x02"
        + struct.pack(">II", 5, 4)
        + REMOTE_SID
        + struct.pack(">I", 6)
        + PAYLOAD
    )


def tls_auth(plain, direction, digest, pid):
    h = hashlib.new(digest)
    hlen = h.digest_size
    k = slot(send_key_index(direction), 1)[:hlen]
    head, body = plain[:9], plain[9:]
    pidb = struct.pack(">II", pid, TIME)
    mac = hmac.new(k, pidb + head + body, digest).digest()
    return head + mac + pidb + body


def tls_crypt(plain, role, pid):
    # tls-crypt: server = direction 0, client = direction 1 (reference 3.4).
    idx = 1 if role == "client" else 0
    ke = slot(idx, 0)[:32]
    ka = slot(idx, 1)[:32]
    head, body = plain[:9], plain[9:]
    header = head + struct.pack(">II", pid, TIME)
    tag = hmac.new(ka, header + body, "sha256").digest()
    enc = Cipher(algorithms.AES(ke), modes.CTR(tag[:16])).encryptor()
    return header + tag + enc.update(body) + enc.finalize()


def rust_const(name, data):
    print(f'const {name}: &str = "{data.hex()}";')


if __name__ == "__main__":
    rust_const("PLAIN_HARD_RESET_CLIENT", hard_reset("client"))
    rust_const("PLAIN_HARD_RESET_SERVER", hard_reset("server"))
    rust_const("PLAIN_CONTROL_V1", control_v1())
    for digest in ["sha1", "sha256", "sha512"]:
        for direction, role in [(0, "server"), (1, "client")]:
            up = f"AUTH_{digest.upper()}_DIR{direction}"
            rust_const(up + "_1", tls_auth(hard_reset(role), direction, digest, 1))
            rust_const(up + "_2", tls_auth(control_v1(), direction, digest, 2))
    # Bidirectional (no key-direction): both sides send with key[0].
    rust_const("AUTH_SHA1_BIDIR_1", tls_auth(hard_reset("client"), None, "sha1", 1))
    for role in ["server", "client"]:
        up = f"CRYPT_{role.upper()}"
        rust_const(up + "_1", tls_crypt(hard_reset(role), role, 1))
        rust_const(up + "_2", tls_crypt(control_v1(), role, 2))
