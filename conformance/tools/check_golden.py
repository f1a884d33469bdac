#!/usr/bin/env python3
"""Independent sanity check of the golden captures in protocol/tests/golden.

For every key_id-0 control packet: verifies the tls-auth HMAC (tls-auth cases, HMAC key =
first H bytes of ta.key bytes 192.. for client->server, 64.. for server->client) or decrypts and
verifies the tls-crypt tag (AES-256-CTR + HMAC-SHA256), then prints opcode, replay packet-id,
ACK list, message id and length. key_id 1 packets (after the soft reset) are wrapped with the
dynamic tls-crypt keys logged in keys.txt and are only listed. Exits 1 if any check fails.

Usage: python3 conformance/tools/check_golden.py [protocol/tests/golden]
"""
import hashlib
import hmac
import os
import sys
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
def key(d):
    t=open(d+'/ta.key').read(); h=t[t.index('-----BEGIN'):]; h=''.join(h.splitlines()[1:-1]); return bytes.fromhex(h)
names={1:'HRC1',3:'SOFT_RESET',4:'CONTROL',5:'ACK',6:'DATA_V1',7:'HARD_RESET_CLIENT_V2',8:'HARD_RESET_SERVER_V2',9:'DATA_V2'}
GOLDEN = sys.argv[1] if len(sys.argv) > 1 else 'protocol/tests/golden'
os.chdir(GOLDEN)
bad = False
for case,dig,H in (('tls-auth-sha1',hashlib.sha1,20),('tls-auth-sha256',hashlib.sha256,32),('tls-crypt',None,0)):
    k=key(case)
    for d,out in (('c2s',192),('s2c',64)):
        pk=[bytes.fromhex(l) for l in open(f'{case}/{d}.hex').read().split()]
        summ=[]
        for p in pk:
            op,kid=p[0]>>3,p[0]&7
            if op in (6,9): summ.append(f'{names[op]}/k{kid}({len(p)})'); continue
            if kid==0 and dig:
                mac=p[9:9+H]; rest=p[9+H:]
                m=hmac.new(k[out:out+H],rest[:8]+p[:9]+rest[8:],dig).digest()
                ok=mac==m; body=rest[8:]; pid=int.from_bytes(rest[:4],'big')
            elif kid==0:
                tag=p[17:49]; ke=k[out-64:out-64+32]; ka=k[out:out+32]
                dec=Cipher(algorithms.AES(ke),modes.CTR(tag[:16])).decryptor(); body=dec.update(p[49:])+dec.finalize()
                ok=hmac.new(ka,p[:17]+body,hashlib.sha256).digest()==tag; pid=int.from_bytes(p[9:13],'big')
            else:
                summ.append(f'{names[op]}/k{kid}({len(p)},dyn-tls-crypt)'); continue
            n=body[0]; acks=[int.from_bytes(body[1+4*i:5+4*i],'big') for i in range(n)]
            off=1+4*n+(8 if n else 0)
            msg=int.from_bytes(body[off:off+4],'big') if op!=5 else None
            summ.append(f'{names[op]}/k{kid}(pid={pid},acks={acks},msg={msg},len={len(p)},{"OK" if ok else "BADMAC"})')
        print(case,d,len(pk)); print('  '+'\n  '.join(summ))
        bad = bad or any('BADMAC' in x for x in summ)
sys.exit(1 if bad else 0)
