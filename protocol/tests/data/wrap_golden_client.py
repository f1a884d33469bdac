#!/usr/bin/env python3
"""Sends one wrapped P_CONTROL_HARD_RESET_CLIENT_V2 (random session id, pid 1, net_time = now)
to a real OpenVPN 2.6.14 server on 127.0.0.1 and prints the packet sent and the server's reply
(hex, without the TCP length prefix). Run from a directory holding `ta.key`
(= genkey-2.6.14.key). Used to capture the vectors of tests/wrap_golden.rs:

  openvpn --port P --local 127.0.0.1 --proto tcp-server --dev null --ca ca.crt \
          --cert server.crt --key server.key --dh none --tls-server --verb 3 \
          --tls-auth ta.key 0 [--auth SHA256]    |    --tls-crypt ta.key
  python3 wrap_golden_client.py auth-sha1|auth-sha256|crypt P

(ca/server certificate: any P-256 pair made with the openssl CLI; the server answers the
hard reset before any TLS.)
"""
import socket, struct, sys, time, hmac, hashlib, os
sys.path.insert(0, "/work/wt/b/protocol/tests/data")
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
mode, port = sys.argv[1], int(sys.argv[2])
txt = open("ta.key").read().split("-----BEGIN OpenVPN Static key V1-----")[1].split("-----END")[0]
KEY = bytes.fromhex("".join(txt.split()))
sid = os.urandom(8)
plain = bytes([7 << 3]) + sid + b"\x00" + struct.pack(">I", 0)
head, body = plain[:9], plain[9:]
pidb = struct.pack(">II", 1, int(time.time()))
if mode.startswith("auth"):
    dg = mode.split("-")[1]
    hl = hashlib.new(dg).digest_size
    k = KEY[192:192 + hl]
    wire = head + hmac.new(k, pidb + head + body, dg).digest() + pidb + body
else:
    ke, ka = KEY[128:160], KEY[192:224]
    tag = hmac.new(ka, head + pidb + body, "sha256").digest()
    e = Cipher(algorithms.AES(ke), modes.CTR(tag[:16])).encryptor()
    wire = head + pidb + tag + e.update(body) + e.finalize()
s = socket.create_connection(("127.0.0.1", port), timeout=5)
s.sendall(struct.pack(">H", len(wire)) + wire)
n = struct.unpack(">H", s.recv(2))[0]
resp = b""
while len(resp) < n:
    resp += s.recv(n - len(resp))
print(wire.hex())
print(resp.hex())
