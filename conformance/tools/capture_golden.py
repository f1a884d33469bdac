#!/usr/bin/env python3
"""Capture golden OpenVPN 2.6 TCP-mode packets from a real upstream server/client pair.

Runs Debian's `openvpn` as `proto tcp-server` and `proto tcp-client` on 127.0.0.1 inside ONE
private network namespace created by this script, records the loopback traffic with
`tcpdump -i lo -w`, reassembles each TCP direction and cuts it into packets by the 2-byte
length prefix. Writes, per case, into OUT_DIR/<case>/:

    ta.key          the static key both peers used
    c2s.hex         client -> server packets, one per line, hex, without the 2-byte length
    s2c.hex         server -> client packets, same format
    keys.txt        key-material and nonce lines openvpn logs at verb 9 (control and data channel)
    server.conf     server config as run (file paths relative to the case's temp dir)
    client.conf     client config as run

Usage (as root, needs ip, openvpn, openssl, tcpdump):

    python3 conformance/tools/capture_golden.py protocol/tests/golden

The namespace and every process this script starts are removed/killed on exit, also on error
or Ctrl-C. Traffic never leaves 127.0.0.1 inside the namespace; nothing is configured in the
root namespace.
"""

import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

PORT = 11940
CASES = {
    "tls-auth-sha1": {
        "server": ["tls-auth ta.key 0"],
        "client": ["tls-auth ta.key 1"],
    },
    "tls-auth-sha256": {
        "server": ["tls-auth ta.key 0", "auth SHA256"],
        "client": ["tls-auth ta.key 1", "auth SHA256"],
    },
    "tls-crypt": {
        "server": ["tls-crypt ta.key"],
        "client": ["tls-crypt ta.key"],
    },
}

SERVER_BASE = [
    "proto tcp-server",
    "local 127.0.0.1",
    f"port {PORT}",
    "dev tun",
    "topology subnet",
    "server 192.168.123.0 255.255.255.0",
    # Short keepalive so a few data-channel pings follow the handshake.
    "keepalive 1 10",
    # Early server-initiated renegotiation, so the capture holds a soft reset (key_id 1) too.
    "reneg-sec 6",
    "ca ca.crt",
    "cert server.crt",
    "key server.key",
    "dh none",
]
CLIENT_BASE = [
    "client",
    "proto tcp-client",
    f"remote 127.0.0.1 {PORT}",
    "dev tun",
    "nobind",
    "ca ca.crt",
    "cert client.crt",
    "key client.key",
    "remote-cert-tls server",
]

STARTED = []  # Popen objects, killed by PID in cleanup()


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def spawn(ns, cmd, **kw):
    p = subprocess.Popen(["ip", "netns", "exec", ns] + cmd, **kw)
    STARTED.append(p)
    return p


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=3)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def make_pki(d):
    """ECDSA P-256 CA, server cert (KU digitalSignature,keyEncipherment; EKU serverAuth),
    client cert (KU digitalSignature; EKU clientAuth)."""
    ext = os.path.join(d, "ext.cnf")
    with open(ext, "w") as f:
        f.write(
            "[ca]\nbasicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n"
            "subjectKeyIdentifier=hash\n"
            "[server]\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            "[client]\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=clientAuth\n"
        )
    for name in ("ca", "server", "client"):
        run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", f"{name}.key"], cwd=d)
    run(["openssl", "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=vpnt-golden-ca",
         "-days", "3650", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", "ca.crt"], cwd=d)
    for i, name in enumerate(("server", "client"), start=2):
        run(["openssl", "req", "-new", "-key", f"{name}.key", "-subj", f"/CN={name}",
             "-out", f"{name}.csr"], cwd=d)
        run(["openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-set_serial", str(i), "-days", "3650", "-extfile", "ext.cnf", "-extensions", name,
             "-out", f"{name}.crt"], cwd=d)


# ---- pcap reading and TCP reassembly -------------------------------------------------------

def read_pcap(path):
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack("<I", data[:4])[0]
    if magic in (0xA1B2C3D4, 0xA1B23C4D):
        e = "<"
    else:
        e = ">"
    linktype = struct.unpack(e + "I", data[20:24])[0]
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(e + "IIII", data[off:off + 16])
        off += 16
        yield linktype, data[off:off + incl]
        off += incl


def tcp_segments(path):
    for linktype, frame in read_pcap(path):
        if linktype == 1:  # Ethernet
            if struct.unpack(">H", frame[12:14])[0] != 0x0800:
                continue
            ip = frame[14:]
        elif linktype == 113:  # Linux cooked
            ip = frame[16:]
        elif linktype == 276:  # Linux cooked v2
            ip = frame[20:]
        else:
            raise SystemExit(f"unsupported pcap linktype {linktype}")
        if ip[0] >> 4 != 4 or ip[9] != 6:
            continue
        ihl = (ip[0] & 15) * 4
        total = struct.unpack(">H", ip[2:4])[0]
        tcp = ip[ihl:total]
        sport, dport, seq = struct.unpack(">HHI", tcp[:8])
        doff = (tcp[12] >> 4) * 4
        flags = tcp[13]
        yield sport, dport, seq, flags, tcp[doff:]


def reassemble(path):
    """Return {(sport, dport): bytes} for each direction of the (single) TCP connection."""
    isn = {}
    chunks = {}
    for sport, dport, seq, flags, payload in tcp_segments(path):
        key = (sport, dport)
        if flags & 0x02:  # SYN
            isn[key] = seq
            continue
        if payload:
            rel = (seq - isn[key] - 1) & 0xFFFFFFFF
            chunks.setdefault(key, {})[rel] = payload
    out = {}
    for key, segs in chunks.items():
        buf = bytearray()
        for rel in sorted(segs):
            p = segs[rel]
            if rel > len(buf):
                raise SystemExit(f"gap in TCP stream {key} at {len(buf)}")
            buf += p[len(buf) - rel:]
        out[key] = bytes(buf)
    return out


def cut_packets(stream):
    pkts = []
    i = 0
    while i + 2 <= len(stream):
        n = struct.unpack(">H", stream[i:i + 2])[0]
        if i + 2 + n > len(stream):
            break  # capture ended mid-packet
        pkts.append(stream[i + 2:i + 2 + n])
        i += 2 + n
    return pkts


# ---- one case ------------------------------------------------------------------------------

# Log lines (verb 9) worth keeping beside the packets: every key the peers derived (control
# channel, dynamic tls-crypt, data channel), the AEAD nonces and associated data of data packets,
# the sids and the push exchange.
KEY_LINE_MARKERS = (
    "KEY:",
    "Channel: Cipher",
    "Data Channel: cipher",
    "ENCRYPT IV:",
    "DECRYPT IV:",
    "ENCRYPT AD:",
    "DECRYPT AD:",
    "Initial packet from",
    "PUSH: Received control message",
    "SENT CONTROL",
)


def capture_case(ns, name, case, pki, out_dir):
    work = tempfile.mkdtemp(prefix=f"golden-{name}-")
    try:
        for f in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key"):
            shutil.copy(os.path.join(pki, f), work)
        run(["openvpn", "--genkey", "secret", "ta.key"], cwd=work)
        server_conf = SERVER_BASE + case["server"]
        client_conf = CLIENT_BASE + case["client"]
        with open(os.path.join(work, "server.conf"), "w") as f:
            f.write("\n".join(server_conf) + "\n")
        with open(os.path.join(work, "client.conf"), "w") as f:
            f.write("\n".join(client_conf) + "\n")

        pcap = os.path.join(work, "cap.pcap")
        dump = spawn(ns, ["tcpdump", "-i", "lo", "-U", "-s", "0", "-w", pcap, "tcp", "port", str(PORT)],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        server = spawn(ns, ["timeout", "30", "openvpn", "--config", "server.conf", "--verb", "9",
                            "--log", "server.log"], cwd=work)
        slog = os.path.join(work, "server.log")
        deadline = time.time() + 10
        while time.time() < deadline:
            if os.path.exists(slog) and "Listening for incoming TCP connection" in open(slog).read():
                break
            time.sleep(0.1)
        else:
            raise SystemExit(f"{name}: server did not start listening")
        client = spawn(ns, ["timeout", "30", "openvpn", "--config", "client.conf", "--verb", "9",
                            "--log", "client.log"], cwd=work)
        clog = os.path.join(work, "client.log")
        deadline = time.time() + 20
        while time.time() < deadline:
            if os.path.exists(clog) and "Initialization Sequence Completed" in open(clog).read():
                break
            time.sleep(0.1)
        else:
            raise SystemExit(f"{name}: client did not complete initialization")
        # Wait for the soft reset (key_id 1) to finish, then let a few pings use the new key.
        deadline = time.time() + 20
        while time.time() < deadline:
            if open(clog).read().count("Outgoing Data Channel: Cipher") >= 2:
                break
            time.sleep(0.1)
        else:
            raise SystemExit(f"{name}: no renegotiation seen")
        time.sleep(2.5)
        stop(client)
        time.sleep(0.5)
        stop(server)
        time.sleep(0.5)
        stop(dump)

        streams = reassemble(pcap)
        c2s = [k for k in streams if k[1] == PORT]
        s2c = [k for k in streams if k[0] == PORT]
        if len(c2s) != 1 or len(s2c) != 1:
            raise SystemExit(f"{name}: expected one TCP connection, got {list(streams)}")
        dest = os.path.join(out_dir, name)
        os.makedirs(dest, exist_ok=True)
        shutil.copy(os.path.join(work, "ta.key"), dest)
        counts = {}
        for fname, key in (("c2s.hex", c2s[0]), ("s2c.hex", s2c[0])):
            pkts = cut_packets(streams[key])
            counts[fname] = (len(pkts), sum(1 for p in pkts if (p[0] >> 3) in (6, 9)))
            with open(os.path.join(dest, fname), "w") as f:
                for p in pkts:
                    f.write(p.hex() + "\n")
        with open(os.path.join(dest, "keys.txt"), "w") as f:
            for role, log in (("server", slog), ("client", clog)):
                for line in open(log):
                    if any(m in line for m in KEY_LINE_MARKERS):
                        f.write(f"{role}: {line}")
        shutil.copy(os.path.join(work, "server.conf"), dest)
        shutil.copy(os.path.join(work, "client.conf"), dest)
        print(f"{name}: c2s {counts['c2s.hex']} s2c {counts['s2c.hex']} (packets, of which data)")
        if os.environ.get("KEEP_LOGS"):
            for role, log in (("server", slog), ("client", clog)):
                shutil.copy(log, os.path.join(os.environ["KEEP_LOGS"], f"{name}-{role}.log"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out_dir = os.path.abspath(sys.argv[1])
    if os.geteuid() != 0:
        raise SystemExit("must run as root (needs ip netns)")
    ns = f"vpnt-golden-{os.getpid()}"
    pki = tempfile.mkdtemp(prefix="golden-pki-")
    run(["ip", "netns", "add", ns])
    try:
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        make_pki(pki)
        for name, case in CASES.items():
            capture_case(ns, name, case, pki, out_dir)
    finally:
        for p in STARTED:
            stop(p)
        # Anything still in the namespace was started by us: kill it by PID.
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["ip", "netns", "del", ns])
        shutil.rmtree(pki, ignore_errors=True)


if __name__ == "__main__":
    main()
